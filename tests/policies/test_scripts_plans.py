"""The measurement plans on the packaged H200 data: scripts/plan_coverage.py and scripts/plan_zoo.py over
kernel_gym.train.measurement_plans (what `collect --plan` should measure), and benchmarks/heldout_live/run.py's
planning half (which held-out choices to time again, and how a paired round is scored)."""

from __future__ import annotations

import json

import pytest

from kernel_gym.train.measurement_plans import neighbours, remaining
from tests.script_module import load_script


def test_plan_coverage_lists_only_unstored_valid_candidates_in_collects_format(tmp_path):
    from kernel_gym.measure.collect import load_plan_file
    from kernel_gym.measure.recorded import RecordedBackend

    out = tmp_path / "plan.json"
    args = ["--kernels", "prefill_attention", "--models", "mixtral-8x7b", "--depth", "1", "--top", "2",
            "--out", str(out)]
    assert load_script("plan_coverage").main(args) == 0
    plan = json.loads(out.read_text())
    stored = RecordedBackend().stored_keys("prefill_attention")
    pairs = [(e["workload"], c) for e in plan for c in e["configs"]]
    assert pairs and not any(p in stored for p in pairs)  # nothing already measured is planned again
    chunks = load_plan_file(str(out), ["prefill_attention"])  # collect accepts it: every config valid there
    assert sorted((item.workload_key, c) for chunk in chunks for item in chunk for c in item.configs) == sorted(pairs)
    with pytest.raises(SystemExit):
        load_script("plan_coverage").main(["--depth", "0", "--out", str(out)])


def test_heldout_live_pairs_rounds_and_plans_every_heldout_workload(tmp_path):
    from benchmarks.heldout_live import run as ex
    rounds = {"a": [1.0, 2.0, 3.0], "b": [2.0, 1.0, 3.3]}
    assert ex._paired(rounds, "a") == 1.0  # per round: fastest / a = 1, 0.5, 1 -> median 1
    assert ex._paired(rounds, "b") == pytest.approx(3.0 / 3.3)  # 0.5, 1, 0.909 -> median 0.909
    assert ex._paired(rounds, "c") is None  # failed its check: not timed

    out = tmp_path / "plan.json"
    assert ex.main(["plan", "--envs", "KernelGym/MoE-v0", "--models", "olmoe-1b-7b", "--timesteps", "256",
                    "--runner-ups", "2", "--out", str(out), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
                    "--checkpoints", str(tmp_path / "ck")]) == 0
    entries = json.loads(out.read_text())["entries"]
    assert len(entries) == 15  # olmoe MoE's held-out workloads (benchmarks/policy_quality.md)
    for e in entries:
        assert e["configs"][0] == e["chosen"] and e["oracle"] in e["configs"] and len(e["configs"]) <= 4
        assert 0 < e["recorded_ratio"] <= 1
        assert e["recorded_ms"][e["oracle"]] == min(t for t in e["recorded_ms"].values() if t)

    result = {"results": [{"env_id": "E", "model": "m", "recorded_ratio": 0.8, "live_ratio": 0.9,
                           "oracle_live_ratio": 1.0},
                          {"env_id": "E", "model": "m", "recorded_ratio": 0.5, "live_ratio": None,
                           "oracle_live_ratio": 1.0}]}
    assert "| E | m | 1 | 0.800 | 0.900 | 1.000 |" in ex.report_table(result)


def test_plan_coverage_new_shapes_plans_only_the_values_the_grid_gained(tmp_path, monkeypatch):
    """--new-shapes: nothing while every grid value is measured; after the decode grid gains batch 96, exactly its
    shapes, each with collect's seeded sample, the default and its measured neighbours' fastest configs."""
    from kernel_gym.kernels import get_family, workloads
    from kernel_gym.measure.collect import load_plan_file
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.train.train import prepare_data

    script = load_script("plan_coverage")
    out = tmp_path / "plan.json"
    args = ["--kernels", "decode_attention", "--models", "olmoe-1b-7b", "--new-shapes", "--neighbour-top", "4",
            "--out", str(out)]
    assert script.main(args) == 0 and json.loads(out.read_text()) == []
    monkeypatch.setattr(workloads, "DECODE_BATCHES", (*workloads.DECODE_BATCHES, 96))
    assert script.main(args) == 0
    plan = json.loads(out.read_text())
    family = get_family("decode_attention")
    shapes = [workloads.workload_from_key("decode_attention", e["workload"]) for e in plan]
    assert shapes and {w.batch for w in shapes} == {96}
    backend = RecordedBackend()
    data = prepare_data("decode_attention", backend, "olmoe-1b-7b")
    refs = data.train + data.heldout
    for entry, w in zip(plan, shapes):
        near = neighbours(w, refs)
        below = [r for r in near if r.workload.batch < 96]
        assert near and len(below) <= 1 and len(near) - len(below) <= 1
        assert all(r.workload.context_len == w.context_len for r in near)
        for ref in near:
            fastest = sorted(ref.times, key=ref.times.__getitem__)[:4]
            assert {str(c) for c in fastest if family.space.is_valid(c, w)} <= set(entry["configs"])
        assert str(family.default_config(w)) in entry["configs"]
    load_plan_file(str(out), ["decode_attention"])  # collect accepts it: every config valid there


def test_plan_coverage_fill_plans_the_grids_holes_at_old_values(tmp_path):
    """--new-shapes --fill: every default-grid shape without rows (holes at batch values other shapes have), none
    stored, each with the default config; without --fill the same grid plans nothing. The packaged data's OLMoE
    decode grid has no hole since the fills of benchmarks/live_e2e/graphs/ were merged, so the holes here are made:
    a store of the packaged decode rows less those of four grid shapes."""
    from kernel_gym.kernels import get_family, workloads
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.measure.store import PACKAGED_SNAPSHOT, MeasurementStore, load_rows
    from kernel_gym.models import load_model

    grid = {w.key() for w in workloads.model_workloads("decode_attention", load_model("olmoe-1b-7b"))}
    holes = {w for w in grid if workloads.workload_from_key("decode_attention", w).batch in (128, 256)
             and workloads.workload_from_key("decode_attention", w).context_len in (1024, 4096)}
    data = tmp_path / "holes.sqlite"
    with MeasurementStore(data) as store:
        for ctx, rows in load_rows(PACKAGED_SNAPSHOT):
            if ctx.kernel == "decode_attention":
                store.put_many(ctx, [m for m in rows if m.workload not in holes])
    stored = {w for w, _ in RecordedBackend(data).stored_keys("decode_attention")}
    assert len(holes) == 4 and not holes & stored and {w for w, _ in RecordedBackend().stored_keys(
        "decode_attention")} >= holes  # each made hole is stored in the packaged data
    out = tmp_path / "plan.json"
    args = ["--kernels", "decode_attention", "--models", "olmoe-1b-7b", "--new-shapes", "--fill", "--neighbour-top",
            "2", "--configs-per-shape", "2"]
    assert load_script("plan_coverage").main(args + ["--data", str(data), "--out", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert {e["workload"] for e in plan} == grid - stored >= holes
    batches = {workloads.workload_from_key("decode_attention", e["workload"]).batch for e in plan}
    assert batches <= set(workloads.DECODE_BATCHES)  # values the grid had: holes, not new values
    family = get_family("decode_attention")
    for e in plan:
        w = workloads.workload_from_key("decode_attention", e["workload"])
        assert str(family.default_config(w)) in e["configs"]
    # on the packaged data: exactly the grid's unstored shapes (none left for OLMoE's decode grid)
    assert load_script("plan_coverage").main(args + ["--out", str(tmp_path / "packaged.json")]) == 0
    assert {e["workload"] for e in json.loads((tmp_path / "packaged.json").read_text())} == grid - {
        w for w, _ in RecordedBackend().stored_keys("decode_attention")}
    with pytest.raises(SystemExit):
        load_script("plan_coverage").main(["--fill", "--out", str(out)])


def test_plan_coverage_new_knobs_lists_unstored_configs_that_set_a_new_knob(tmp_path):
    """--new-knobs: prefill's IMPL values of session 5 were all measured, so its entries are the persistent
    schedules or PACK_GQA configs, added after (no stored row; PACK_GQA's top variants were measured since, not every
    valid one); any MoE entry sets TMA_LOADS; nothing listed is stored. --variants-only plans fewer prefill configs,
    each a stored config with one new knob set."""
    from kernel_gym.measure.collect import load_plan_file
    from kernel_gym.measure.recorded import RecordedBackend

    out = tmp_path / "plan.json"
    args = ["--kernels", "prefill_attention,fused_moe", "--models", "mixtral-8x7b", "--new-knobs", "--top", "12",
            "--out", str(out)]
    assert load_script("plan_coverage").main(args) == 0
    plan = json.loads(out.read_text())
    backend = RecordedBackend()
    prefill = [e for e in plan if e["kernel"] == "prefill_attention"]
    assert prefill, "the persistent Gluon schedules have no stored rows: --new-knobs must list them"
    stored = backend.stored_keys("prefill_attention")
    for e in prefill:
        assert all((json.loads(c).get("IMPL", "").endswith("_persistent") or "PACK_GQA" in json.loads(c))
                   and (e["workload"], c) not in stored for c in e["configs"])
    cut = tmp_path / "cut.json"
    assert load_script("plan_coverage").main([*args[:-1], str(cut), "--variants-only"]) == 0
    cut_prefill = [c for e in json.loads(cut.read_text()) if e["kernel"] == "prefill_attention" for c in e["configs"]]
    assert 0 < len(cut_prefill) < sum(len(e["configs"]) for e in prefill)
    assert all(sum(k in json.loads(c) for k in ("IMPL", "PACK_GQA")) == 1 for c in cut_prefill)
    stored = backend.stored_keys("fused_moe")
    for e in plan:
        if e["kernel"] == "fused_moe":
            assert all("TMA_LOADS" in json.loads(c) and (e["workload"], c) not in stored for c in e["configs"])
    load_plan_file(str(out), ["prefill_attention", "fused_moe"])
    with pytest.raises(SystemExit):
        load_script("plan_coverage").main([*args, "--new-shapes"])


def test_new_shape_plan_finds_the_best_of_a_fully_sampled_shape():
    """Why a --new-shapes plan samples a shape well enough to score held-out choices on it: at every decode shape of
    the original batches (each measured with ~280 configs) that has measured neighbours on both sides, the union of
    the neighbours' 16 fastest configs and 30 of its own sampled ones holds its best config to within 0.05% (geomean;
    worst 1.1%)."""
    import math
    import random

    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.train.train import prepare_data

    def sampled(times: dict) -> dict:
        return {c: t for c, t in times.items() if not any(k in c for k in ("PRELOAD_PAGES", "COMBINE", "KV_TMA"))}

    backend = RecordedBackend()
    ratios = []
    for model in ("mixtral-8x7b", "olmoe-1b-7b"):
        data = prepare_data("decode_attention", backend, model)
        refs = data.train + data.heldout
        for ref in refs:
            near = neighbours(ref.workload, refs)
            if len(near) != 2 or ref.workload.batch in (3, 6, 12, 24, 48):  # the new batches were measured this way
                continue
            # the knob values measured since only as variants of each shape's fastest configs (--new-knobs), never
            # sampled: the sampled plan is judged against the sampled rows
            times, near_times = sampled(ref.times), [sampled(n.times) for n in near]
            plan = {c for n in near_times for c in sorted(n, key=n.__getitem__)[:16]}
            plan |= set(random.Random(0).sample(sorted(times, key=str), min(30, len(times))))
            ratios.append(min(times.values()) / min(times[c] for c in plan if c in times))
    assert len(ratios) >= 80
    assert math.exp(sum(map(math.log, ratios)) / len(ratios)) >= 0.9995 and min(ratios) >= 0.989


def test_plan_zoo_remaining_drops_stored_and_invalid_configs_and_puts_large_m_first():
    from kernel_gym.kernels import get_family
    from kernel_gym.kernels.space import Config
    from kernel_gym.kernels.workloads import MoEWorkload

    space = get_family("fused_moe").space
    small = MoEWorkload(16, 8, 2, 256, 512, 0.0)
    large = MoEWorkload(4096, 8, 2, 256, 512, 0.0)
    valid = [str(c) for c in space.sample(small, 3, seed=0)]
    fuse_sum = next(str(c) for c in space.all_configs() if c["FUSE_SUM"] == 1 and space.is_valid(c, small))
    assert not space.is_valid(Config.parse(fuse_sum), large)  # ruled out at large M: the entry must lose it

    class Backend:
        def kernels(self):
            return ["fused_moe"]

        def stored_keys(self, kernel):
            return {(small.key(), valid[0])}

    large_cfgs = [str(c) for c in space.sample(large, 2, seed=0)]
    plan = [{"kernel": "fused_moe", "workload": small.key(), "configs": valid},
            {"kernel": "fused_moe", "workload": large.key(), "configs": [*large_cfgs, fuse_sum]}]
    rest = remaining(plan, Backend())
    assert [e["workload"] for e in rest] == [large.key(), small.key()]  # M = 4096 first
    assert rest[0]["configs"] == large_cfgs  # the config the rules now reject is gone
    assert rest[1]["configs"] == valid[1:]  # the stored one is gone


def test_plan_coverage_neighbour_winners_plans_each_neighbours_fastest_where_not_stored(tmp_path):
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.train.train import prepare_data

    out = tmp_path / "plan.json"
    args = ["--kernels", "prefill_attention", "--models", "mixtral-8x7b", "--top", "2", "--neighbour-winners",
            "--out", str(out)]
    assert load_script("plan_coverage").main(args) == 0
    plan = json.loads(out.read_text())
    backend = RecordedBackend()
    stored = backend.stored_keys("prefill_attention")
    data = prepare_data("prefill_attention", backend, "mixtral-8x7b")
    refs = {r.key: r for r in data.train + data.heldout}
    assert plan
    for e in plan:
        near = neighbours(refs[e["workload"]].workload, list(refs.values()))
        fastest = {str(c) for r in near for c in sorted(r.times, key=r.times.__getitem__)[:2]}
        assert e["configs"] and set(e["configs"]) <= fastest  # only the neighbours' two fastest ...
        assert not any((e["workload"], c) in stored for c in e["configs"])  # ... that this shape has not stored
    with pytest.raises(SystemExit):
        load_script("plan_coverage").main(["--neighbour-winners", "--new-shapes", "--out", str(out)])
