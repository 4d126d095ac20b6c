"""Model shapes at the edges of the shape space, through the CPU paths a user takes: TP-8 shards of many small experts
(per-shard intermediate 16), top-k up to 22, dispatch lookups between bucket centres, and the kernels run under the
Triton interpreter at sizes off every block. Each test failed before its fix (tests/test_unseen_inputs.py holds the
previous audit)."""

from __future__ import annotations

import os

import pytest

from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import DecodeWorkload, MoEWorkload
from kernel_gym.models import ModelSpec

# 512 experts of intermediate 128, top-16: at TP 8 each GPU holds N = 16 of every expert
MANY_SMALL = ModelSpec(name="many-small", num_layers=4, hidden=1536, num_heads=16, num_kv_heads=2, head_dim=128,
                       num_experts=512, top_k=16, intermediate=128)


# ---- fused_moe: the default config of a shard with a tiny intermediate size --------------------------------------

@pytest.mark.parametrize("inter", [1, 8, 16])
@pytest.mark.parametrize("tokens", [1, 5, 64, 4096])
def test_moe_default_config_fits_a_tp8_shard_of_small_experts(tokens, inter):
    from kernel_gym.kernels import fused_moe as moe

    w = MoEWorkload(tokens, 512, 16, 1536, inter)
    cfg = moe.default_config(w)  # raised InvalidConfig: BLOCK_K 64 / BLOCK_N 64 over an N of 16 were never clamped
    assert moe.LAYER_SPACE.is_valid(cfg, w)
    assert cfg["BLOCK_K"] == 32 and cfg["BLOCK_N"] == 32
    # the clamp leaves shapes that fit vLLM's default untouched
    assert moe.default_config(MoEWorkload(1, 8, 2, 4096, 14336))["BLOCK_K"] == 64


def test_moe_default_config_runs_right_on_an_n16_top16_shard():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from kernel_gym.kernels import fused_moe as moe
    from kernel_gym.measure.worker import compare, poisoned_empty

    if torch.cuda.is_available():
        pytest.skip("interpreter check (CPU)")
    w = MoEWorkload(5, 32, 16, 48, 16, 0.0, "float32")
    inputs = moe.make_inputs(w, "cpu", 0)
    with poisoned_empty():
        out = moe.FAMILY.prepare(inputs, moe.default_config(w))()
    assert compare(moe.FAMILY, out, moe.reference(inputs), w.dtype) is None


# ---- the Dispatcher between bucket centres ------------------------------------------------------------------------

def _moe_table():
    from kernel_gym.deploy.export import build_table
    from kernel_gym.kernels import fused_moe as moe

    fused = Config(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=3, SPLIT_K=1, FUSE_SILU=0,
                   FUSE_WEIGHT=1, FUSE_SUM=1)

    def predict(wls):  # FUSE_SUM=1 wherever the rules allow it (up to 96 tokens), the default elsewhere
        return [fused if moe.LAYER_SPACE.is_valid(fused, w) else moe.default_config(w) for w in wls]

    spec = ModelSpec(name="m", num_layers=1, hidden=2048, num_heads=16, num_kv_heads=2, head_dim=128,
                     num_experts=64, top_k=8, intermediate=256)
    return build_table(spec, {"fused_moe": (predict, {"model_uri": "test"})}, rests_on=False), fused


def test_dispatcher_never_hands_out_fuse_sum_above_its_token_limit():
    from kernel_gym.dispatch.dispatcher import Dispatcher
    from kernel_gym.kernels import fused_moe as moe

    table, fused = _moe_table()
    d = Dispatcher(table)
    assert d.moe_config(96) == fused and table.kernels["fused_moe"].lookup(100, 0.0) == fused  # 100 is 96's bucket
    for m in (97, 100, 110):  # were given FUSE_SUM=1, measured wrong on the H200 above 96 tokens
        w = MoEWorkload(m, 64, 8, 2048, 256)
        for cfg in (d.moe_config(m), d.choose("fused_moe", w, None)):
            assert moe.LAYER_SPACE.is_valid(cfg, w) and cfg["FUSE_SUM"] == 0, (m, cfg)
        assert d.choose("fused_moe", w, None) == d.moe_config(m)


def test_dispatcher_checks_a_shape_only_where_its_buckets_corners_do_not_all_accept_the_config(monkeypatch):
    """The hot path: an interior bucket whose config the rules accept at its four corners answers without checking
    each shape; the FUSE_SUM bucket (96 inside it) checks each one, and falls back on a config of the table (one a
    deployment precompiled); a swapped-in table starts over."""
    from kernel_gym.dispatch.dispatcher import Dispatcher
    from kernel_gym.kernels import fused_moe as moe

    table, fused = _moe_table()
    d = Dispatcher(table)
    t = table.kernels["fused_moe"]
    calls = []
    real = moe.LAYER_SPACE.is_valid
    monkeypatch.setattr(moe.LAYER_SPACE, "is_valid", lambda c, w: calls.append(w) or real(c, w))
    d.moe_config(24, 0.3)  # an interior bucket far from 96: its corners are checked once
    first = len(calls)
    assert first == 4
    for m in (23, 24, 25):
        d.moe_config(m, 0.3)
    assert len(calls) == first  # no per-shape check there any more
    fallback = d.moe_config(100)
    assert fallback["FUSE_SUM"] == 0 and fallback in t.configs  # precompiled with the table
    d.swap(table)
    assert not d._safe and not d._fits


def test_dispatcher_decode_split_count_is_valid_at_the_shape_not_only_the_centre():
    from kernel_gym.dispatch.dispatcher import Dispatcher, DispatchTable, KernelTable
    from kernel_gym.kernels import get_family

    space = get_family("decode_attention").space
    centre = DecodeWorkload(8, 1, 128, 1, 2048)
    split = next(c for c in space.valid_configs(centre) if c["NUM_SPLITS"] == 16 and c["BLOCK_N"] == 64)
    fixed = {"num_heads": 8, "num_kv_heads": 1, "head_dim": 128, "dtype": "bfloat16"}
    t = KernelTable("decode_attention", ([1.0], [2048.0]), [split], [0], fixed)
    d = Dispatcher(DispatchTable({"decode_attention": t}))
    w = DecodeWorkload(8, 1, 128, 1, 700)  # 16 splits x 64 > 700: prepare() refuses it
    assert space.why_invalid(split, w)
    for cfg in (d.decode_config(1, 700), d.choose("decode_attention", w, None)):
        assert space.is_valid(cfg, w), cfg
        assert (cfg["PAGE_SIZE"], cfg["LAYOUT"]) == (split["PAGE_SIZE"], split["LAYOUT"])  # the deployment's layout
    assert d.decode_config(1, 2048) == split


# ---- tune: a head_dim the attention kernels do not run -------------------------------------------------------------

def test_tune_refuses_up_front_a_head_dim_the_decode_kernel_cannot_run(tmp_path, capsys):
    import dataclasses
    import json

    from kernel_gym.deploy.tune import tune_model

    spec = tmp_path / "d96.json"
    spec.write_text(json.dumps(dataclasses.asdict(dataclasses.replace(MANY_SMALL, name="d96", head_dim=96))))
    # the dry run printed a plan without decode cells and returned 0; a real run measured for its budget and then
    # failed writing the table (the decode cells' zero-shot default refuses head_dim 96)
    with pytest.raises(ValueError, match=r"decode_attention cannot run this shape \(head_dim 96 is not supported.*"
                                         r"tune the others alone with --kernels fused_moe"):
        tune_model(model=f"{spec}@tp8", dry_run=True, policy_dir=tmp_path / "unread", device="cpu")
    with pytest.raises(ValueError, match="there is nothing else to tune"):
        tune_model(model=str(spec), kernels=["decode_attention"], dry_run=True, policy_dir=tmp_path, device="cpu")


# ---- the environments on a model the data never measured ---------------------------------------------------------

def test_env_on_an_unmeasured_model_names_the_model_and_how_to_measure_it():
    import gymnasium

    import kernel_gym.envs  # noqa: F401 - registers the envs
    from kernel_gym.zoo import shard

    # was "no fused_moe workload has an ok measurement: cannot build a catalogue (check the backend)"
    with pytest.raises(ValueError, match=r"recorded backend has no fused_moe measurement of any of many-small@tp8's "
                                         r".*kernel-gym collect --model SPEC --kernels fused_moe --db STORE"
                                         r".*--backend STORE"):
        gymnasium.make("KernelGym/MoE-v0", model=shard(MANY_SMALL, 8))


# ---- export and plan of a head_dim the attention kernels do not run ----------------------------------------------

def _hd96_spec(tmp_path):
    import dataclasses
    import json

    spec = tmp_path / "hd96.json"
    spec.write_text(json.dumps(dataclasses.asdict(dataclasses.replace(MANY_SMALL, name="hd96", head_dim=96))))
    return spec


def test_export_of_a_head_dim_96_model_keeps_its_moe_table_and_says_why_attention_is_left_out(tmp_path, capsys):
    import json

    from kernel_gym.cli.export import main as export_main

    # was: "kernel-gym export: error: head_dim 96 is not supported ..." and no table at all
    rc = export_main(["--model", str(_hd96_spec(tmp_path)), "--out", str(tmp_path / "out"),
                      "--policy-dir", "benchmarks/generalisation/policies"])
    assert rc == 0
    table = json.loads((tmp_path / "out" / "dispatch_table.json").read_text())
    assert "fused_moe" in table["kernels"] and "decode_attention" not in table["kernels"]
    left = table["meta"]["rests_on"]["decode_attention"]
    assert left["basis"] == "absent" and "head_dim 96 is not supported" in left["why"]
    assert "zero-padded to 128" in capsys.readouterr().err


def test_plan_prices_a_head_dim_96_model_at_the_padded_kernel(tmp_path, capsys):
    from kernel_gym.cli.plan import main as plan_main
    from kernel_gym.models import kernel_spec, load_model

    spec = load_model(str(_hd96_spec(tmp_path)))
    assert kernel_spec(spec).head_dim == 128 and kernel_spec(kernel_spec(spec)) == kernel_spec(spec)
    assert kernel_spec(MANY_SMALL) is MANY_SMALL  # a power of two stays as it is
    # was: "kernel-gym plan: head_dim 96 is not supported: ..." (exit 2)
    rc = plan_main(["--model", str(_hd96_spec(tmp_path)), "--gpus", "1", "--trace", "bundled", "--window-s", "4",
                    "--train-steps", "0", "--samples", "0", "--refine-rounds", "0", "--no-mlflow"])
    assert rc == 0 and "price the padded model" in capsys.readouterr().err


def test_a_head_dim_96_table_is_accepted_for_the_padded_spec_replay_runs(tmp_path):
    import dataclasses

    from kernel_gym.deploy.export import build_table
    from kernel_gym.dispatch.dispatcher import check_table_for
    from kernel_gym.kernels import fused_moe as moe
    from kernel_gym.models import kernel_spec, load_model

    spec = load_model(str(_hd96_spec(tmp_path)))
    table = build_table(spec, {"fused_moe": (lambda wls: [moe.default_config(w) for w in wls], {"model_uri": "t"})},
                        rests_on=False)
    check_table_for(table, kernel_spec(spec))  # was: "its model hd96 has head_dim=96, the spec 128"
    with pytest.raises(ValueError, match="head_dim=96, the spec 64"):
        check_table_for(table, dataclasses.replace(spec, head_dim=64))
    wide = dataclasses.replace(spec, head_dim=300)  # no kernel runs either: 300 and 512 must not pass as equal
    wide_table = build_table(wide, {"fused_moe": (lambda wls: [moe.default_config(w) for w in wls],
                                                  {"model_uri": "t"})}, rests_on=False)
    with pytest.raises(ValueError, match="head_dim=300, the spec 512"):
        check_table_for(wide_table, dataclasses.replace(spec, head_dim=512))
