"""Dispatcher: bucket lookup by bisect, JSON round trip without pickle, KV-layout following, atomic swap under
concurrent readers, the pre-compiled set, the hot path's memo, and the checks a loaded table must pass."""

from __future__ import annotations

import json
import threading

import pytest

from kernel_gym.deploy.export import build_table
from kernel_gym.dispatch.dispatcher import Dispatcher, DispatchTable, KernelTable, bucket_edges
from kernel_gym.kernels import get_family
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload, PrefillWorkload
from kernel_gym.models import BUILTIN_MODELS
from kernel_gym.traffic.simulator import KVLayout

MODEL = BUILTIN_MODELS["mixtral-8x7b"]
A = Config(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=3, SPLIT_K=1, FUSE_SILU=0,
           FUSE_WEIGHT=1, FUSE_SUM=0)
B = A.replace(BLOCK_M=64, GROUP_M=8)


def moe_pred(workloads):
    """Small M -> A, large M -> B, and B at strong skew: a rule the table must reproduce bucket by bucket."""
    return [A if w.num_tokens < 64 and w.skew < 1.0 else B for w in workloads]


def decode_pred(workloads):
    fam = get_family("decode_attention")
    return [fam.default_config(w).replace(PAGE_SIZE=32 if w.batch > 8 else 16) for w in workloads]


def prefill_pred(workloads):
    fam = get_family("prefill_attention")
    return [fam.default_config(w) for w in workloads]


@pytest.fixture(scope="module")
def table():
    return build_table(MODEL, {"fused_moe": (moe_pred, {"model_uri": "test"}),
                               "decode_attention": (decode_pred, {"model_uri": "test"}),
                               "prefill_attention": (prefill_pred, {"model_uri": "test"})})


def moe(m, skew=0.0):
    return MoEWorkload(m, 8, 2, 4096, 14336, skew)


def test_edges_are_geometric_midpoints_and_lookup_bisects():
    assert bucket_edges([1, 4, 16], log=True) == [2.0, 8.0]
    assert bucket_edges([0.0, 0.6], log=False) == [0.3]
    with pytest.raises(ValueError, match="strictly increasing"):
        bucket_edges([4, 1], log=True)
    t = KernelTable("fused_moe", ([1, 4, 16], [0.0, 1.0]), [A, B], [0, 1, 0, 1, 1, 1])
    assert t.lookup(1.9, 0.2) == A and t.lookup(2.1, 0.2) == A and t.lookup(1, 0.6) == B
    assert t.lookup(9, 0.0) == B and t.lookup(10_000, -3) == B  # outside the grid: the edge bucket
    with pytest.raises(ValueError, match="cells"):
        KernelTable("fused_moe", ([1, 4], [0.0]), [A], [0])


def test_choose_follows_the_policy_per_bucket(table):
    d = Dispatcher(table)
    for m in (1, 7, 33, 47, 96, 500, 8192):
        for s in (0.0, 0.6, 1.2):
            assert d.choose("fused_moe", moe(m, s), None) == moe_pred([moe(m, s)])[0], (m, s)
    assert d.moe_config(16, 0.0) == A and d.moe_config(4096, 0.0) == B
    pre = PrefillWorkload(32, 8, 128, (512, 100))
    assert d.choose("prefill_attention", pre, None) == d.prefill_config((512, 100))


def test_decode_configs_carry_one_layout_and_follow_the_layout_in_force(table):
    d = Dispatcher(table)
    t = table.kernels["decode_attention"]
    assert {(c["PAGE_SIZE"], c["LAYOUT"]) for c in t.configs} == {(t.kv_layout["page_size"], t.kv_layout["layout"])}
    assert d.kv_layout == KVLayout(t.kv_layout["page_size"], t.kv_layout["layout"])
    w = DecodeWorkload(32, 8, 128, 4, 1000)
    cfg = d.choose("decode_attention", w, KVLayout(64, "HND"))
    assert (cfg["PAGE_SIZE"], cfg["LAYOUT"]) == (64, "HND")
    assert get_family("decode_attention").space.is_valid(cfg, w)


def test_json_round_trip_is_plain_json(table, tmp_path):
    path = table.save(tmp_path / "t.json")
    data = json.loads(path.read_text())
    assert data["format"] == "kernel-gym-dispatch/1" and data["device"] == "NVIDIA H200"
    assert data["model"]["name"] == "mixtral-8x7b" and "created" in data["versions"]
    assert data["kernels"]["fused_moe"]["policy"] == {"model_uri": "test"}
    back = DispatchTable.load(path)
    d1, d2 = Dispatcher(table), Dispatcher(back)
    for m in (1, 3, 100, 3000):
        assert d1.moe_config(m, 0.5) == d2.moe_config(m, 0.5)
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="kernel-gym export"):
        DispatchTable.load(path)
    with pytest.raises(FileNotFoundError, match="kernel-gym export"):
        DispatchTable.load(tmp_path / "missing.json")


def test_swap_is_atomic_for_concurrent_readers(table):
    only_a = build_table(MODEL, {"fused_moe": (lambda ws: [A] * len(ws), {})})
    only_b = build_table(MODEL, {"fused_moe": (lambda ws: [B] * len(ws), {})})
    d = Dispatcher(only_a)
    seen, stop = set(), threading.Event()

    def reader():
        while not stop.is_set():
            seen.add(d.moe_config(32, 0.0))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for th in threads:
        th.start()
    for i in range(200):
        d.swap(only_b if i % 2 == 0 else only_a)
    stop.set()
    for th in threads:
        th.join()
    assert seen <= {A, B} and d.swaps == 200
    assert d.swap(only_b) is only_a and d.moe_config(32, 0.0) == B


def test_precompiled_set_is_every_config_the_table_can_choose(table):
    d = Dispatcher(table)
    expected = {(k, c) for k, t in table.kernels.items() for c in t.configs}
    assert d.precompiled == expected and d.precompile("cpu") == expected
    assert d.precompile("cpu", kernels=["fused_moe"]) == {("fused_moe", A), ("fused_moe", B)}
    with pytest.raises(ValueError, match="'cpu' or 'cuda"):
        d.precompile("tpu")


def test_the_hot_path_is_lookups_and_a_bounded_memo(table):
    """No wall clock: the per-call work is checked by what it touches. Repeated decode calls under one KV layout
    reuse one memo entry per (config, layout, workload), and choose() equals the bare bisect lookup."""
    d = Dispatcher(table)
    wls = [moe(m, s) for m in (1, 24, 300, 4096) for s in (0.0, 0.7)]
    dec = DecodeWorkload(32, 8, 128, 64, 2048)
    other = KVLayout(64, "HND")
    for i in range(2_000):
        assert d.choose("fused_moe", wls[i & 7], None) == d.moe_config(wls[i & 7].num_tokens, wls[i & 7].skew)
        d.choose("decode_attention", dec, other)
    assert len(d._follow) == 1  # one bucket's config moved to one layout: memoised once, not per call


def test_a_config_moved_to_the_layout_in_force_does_not_depend_on_earlier_calls():
    """A decode config that is invalid on the serving layout is moved to the nearest valid one there, which depends on
    the batch and context (split counts). The live runs' learned tables (128-token HND pages, served on 16-token NHD
    pages) were once answered with the first shape's move at every later shape: the served config depended on the
    order of earlier calls."""
    learned = Config(BLOCK_N=64, COMBINE=1, GQA_GROUPED=1, KV_TMA=1, LAYOUT="HND", NUM_SPLITS=8, PAGE_SIZE=128,
                     num_stages=2, num_warps=4)
    table = build_table(MODEL, {"decode_attention": (lambda ws: [learned] * len(ws), {"model_uri": "test"})})
    serving = KVLayout(16, "NHD")
    shapes = [DecodeWorkload(32, 8, 128, b, c) for b in (1, 4, 8, 19, 32, 64) for c in (256, 1218, 4096, 16384)]
    fresh = {w: Dispatcher(table).choose("decode_attention", w, serving) for w in shapes}
    assert len(set(fresh.values())) > 1  # the move differs by shape: else this test could not fail
    for order in (shapes, shapes[::-1], shapes[1::2] + shapes[::2]):
        d = Dispatcher(table)
        assert {w: d.choose("decode_attention", w, serving) for w in order} == fresh


def test_choose_within_keeps_the_policy_choice_inside_the_available_configs(table):
    d = Dispatcher(table)
    w = moe(16, 0.0)  # its bucket holds A; B is the policy's choice one bucket over (64 tokens)
    assert d.choose_within("fused_moe", w, None, [A, B]) == A  # listed: unchanged
    assert d.choose_within("fused_moe", w, None, [B]) == B  # A not available: the nearest bucket's own choice
    C = A.replace(BLOCK_N=128)  # neither table config available: the nearest in knob space
    far = A.replace(BLOCK_N=32, BLOCK_K=32, num_warps=8)
    assert d.choose_within("fused_moe", w, None, [far, C]) == C
    assert d.choose_within("fused_moe", w, None, []) == A  # no mask: the table's choice


# ---- a table is checked as data (issue 25 item 5) ----------------------------------------------------------------


def test_a_config_outside_the_knob_space_is_refused_at_load(table, tmp_path):
    data = table.to_dict()
    data["kernels"]["fused_moe"]["configs"][0]["BLOCK_M"] = 7
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"t\.json: fused_moe: configs\[0\] .*BLOCK_M=7 is not one of"):
        DispatchTable.load(path)
    data["kernels"]["fused_moe"]["configs"][0] = {**dict(A), "EVIL": 1}
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="differ from fused_moe's"):
        DispatchTable.load(path)


def test_duplicate_keys_in_a_table_file_are_refused(table, tmp_path):
    path = table.save(tmp_path / "t.json")
    text = path.read_text().replace('"device": "NVIDIA H200"', '"device": "NVIDIA H200", "device": "NVIDIA A100"', 1)
    path.write_text(text)
    with pytest.raises(ValueError, match="key 'device' appears twice"):
        DispatchTable.load(path)


def test_a_table_relabelled_for_another_model_or_with_invalid_buckets_is_refused():
    from kernel_gym.dispatch.dispatcher import check_table_for

    fam = get_family("fused_moe")
    table = build_table(MODEL, {"fused_moe": (lambda ws: [fam.default_config(w) for w in ws], {})})
    check_table_for(table, MODEL)  # a table of valid choices passes
    olmoe = BUILTIN_MODELS["olmoe-1b-7b"]
    relabelled = DispatchTable.from_dict({**table.to_dict(), "model": {"name": "olmoe-1b-7b"}})
    with pytest.raises(ValueError, match="fused_moe buckets are for num_experts=8, the model olmoe-1b-7b has 64"):
        check_table_for(relabelled, olmoe)
    with pytest.raises(ValueError, match="exported for model mixtral-8x7b, not olmoe-1b-7b"):
        check_table_for(table, olmoe)
    data = table.to_dict()  # every MoE bucket: a config the rules reject (no shared memory would hold it)
    huge = {**dict(A), "BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 128, "num_stages": 4}
    data["kernels"]["fused_moe"]["configs"] = [huge]
    data["kernels"]["fused_moe"]["cells"] = [0] * len(data["kernels"]["fused_moe"]["cells"])
    broken = DispatchTable.from_dict(data)
    with pytest.raises(ValueError, match="buckets hold configs the knob-space rules reject"):
        check_table_for(broken, MODEL)


def test_choose_within_looks_no_further_than_the_adjacent_buckets():
    """The whole-grid search served a batch-1 long-context decode with a large-batch bucket's unsplit config, the only
    listed choice on the grid (2.5-4x slower there; replay on dataset a827d5fc, Azure code on OLMoE: 0.848 of the
    oracle). Past the adjacent buckets the listed config nearest the policy's own choice wins."""
    split = Config(BLOCK_N=64, COMBINE=1, GQA_GROUPED=1, LAYOUT="NHD", NUM_SPLITS=8, PAGE_SIZE=16, num_stages=2,
                   num_warps=4)
    unsplit = split.replace(NUM_SPLITS=1, BLOCK_N=128, COMBINE=0)

    def policy(ws):
        return [unsplit if w.batch >= 64 else split for w in ws]

    d = Dispatcher(build_table(MODEL, {"decode_attention": (policy, {"model_uri": "test"})}))
    w = DecodeWorkload(32, 8, 128, 1, 4096)
    chosen = d.choose("decode_attention", w, None)
    big = d.choose("decode_attention", DecodeWorkload(32, 8, 128, 64, 4096), None)
    near = chosen.replace(COMBINE=0)  # one knob from the policy's choice, in no bucket of the table
    assert big.get("NUM_SPLITS") == 1 and chosen.get("NUM_SPLITS", 1) > 1 and near not in (chosen, big)
    assert d.choose_within("decode_attention", w, None, [big, near]) == near  # the whole-grid search answered big
