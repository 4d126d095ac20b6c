"""benchmarks/live_e2e/moe_price_check.py's CPU pieces: the plan's configs are the live run's policies' choices (and
the committed plan is not stale), its dataset times are real answers, the whole measuring path runs under the
interpreter on the tiny model, and a wrong launch is reported instead of timed."""

import json
from pathlib import Path

import pytest

from benchmarks.live_e2e import moe_price_check as mpc

PLAN = Path(__file__).resolve().parents[1] / "benchmarks" / "live_e2e" / "moe_price_plan.json"


@pytest.mark.slow
def test_plan_configs_are_the_live_policies_choices_and_the_committed_plan_is_current():
    """For two token counts, each policy's config is what its chooser (run.py's make_chooser, asked as the live run
    asks: on the simulator's rounded count) answers; the dataset's time for it at T and the price --predict charges
    are positive; the committed plan, which the GPU run reads, holds the same rows."""
    from benchmarks.live_e2e import run as le
    from kernel_gym.kernels.workloads import MoEWorkload
    from kernel_gym.models import load_model
    from kernel_gym.traffic.simulator import round_count

    tokens = [16, 48]
    plan = mpc.build_plan("mixtral-8x7b", tokens, list(mpc.POLICIES))
    model = load_model("mixtral-8x7b")
    assert len(plan["rows"]) == len(tokens) * len(mpc.POLICIES)
    configs = set()
    choosers = {spec: le.make_chooser(spec, model) for spec in mpc.POLICIES}
    for row in plan["rows"]:
        t, spec = row["T"], row["policy"]
        wl = MoEWorkload(round_count(t), model.num_experts, model.top_k, model.hidden, model.intermediate, 0.0,
                         "bfloat16")
        assert row["config"] == str(choosers[spec].choose("fused_moe", wl, le.PAGE)), (t, spec)
        assert row["recorded"]["ms"] > 0 and row["recorded"]["status"] == "ok"
        assert row["priced"]["ms"] > 0 and row["priced"]["tokens"] == round_count(t)
        assert row["config"] in row["bucket_configs"] and row["bucket_configs"][row["config"]][1] == t
        configs.add(row["config"])
    assert len(configs) > 1  # the three policies do not all pick one config
    assert [r for r in plan["rows"] if r["T"] == 48][0]["priced"]["tokens"] == 45  # 48 rows priced at round_count
    committed = json.loads(PLAN.read_text())
    assert committed["model"] == "mixtral-8x7b" and committed["dataset_sha256_16"] == plan["dataset_sha256_16"]
    mine = {(r["T"], r["policy"]): r for r in committed["rows"]}
    for row in plan["rows"]:
        old = mine[(row["T"], row["policy"])]
        assert old["config"] == row["config"] and old["recorded"]["ms"] == pytest.approx(row["recorded"]["ms"])
        assert old["priced"]["ms"] == pytest.approx(row["priced"]["ms"])


@pytest.mark.slow
def test_smoke_measures_every_row_checked(tmp_path, capsys):
    """The tiny model end to end on the CPU: every (T, policy) row has A-E timed (wall clocks) after its checks, the
    routings' expert counts add up, and the table comes last on stdout."""
    assert mpc.main(["--smoke", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / mpc.OUT_NAME).read_text())
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(doc["rows"]) == len(plan["rows"]) == len(mpc.SMOKE_TOKENS) * len(mpc.SMOKE_POLICIES)
    assert not doc["skipped_T"] and doc["meta"]["device"] == "cpu-interpreter"
    for row in doc["rows"]:
        m = row["measured"]
        assert "error" not in m, m
        for part in ("A", "B", "B_noflush", "C", "D", "E_A", "E_B"):
            assert m[part]["ms"] > 0, part
        assert m["C"]["layers"] == 2 and row["ratios"]["B/A"] > 0 and row["ratios"]["A/recorded"] is None
    spec = plan["model_spec"]
    for t, r in doc["routing"].items():
        for counts in (r["synthetic_counts"], r["real_router_counts"]):
            assert len(counts) == spec["num_experts"] and sum(counts) == int(t) * spec["top_k"]
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].split()[:3] == ["T", "policy", "A_ms"] and len(out) == 1 + len(doc["rows"])


def test_a_launch_that_leaves_its_output_unwritten_or_wrong_is_caught():
    """_checked (before any timing): a wrong output is refused, and so is one right only because the buffer held the
    answer already (the second run over a NaN-filled output writes nothing)."""
    import torch

    ref = torch.ones(4, 8)
    buf = torch.ones(4, 8)
    assert mpc._checked(lambda: buf, ref, "float32")[1].startswith("second run over a NaN-filled output")
    assert "beyond" in mpc._checked(lambda: torch.zeros(4, 8), ref, "float32")[1]
    good, wrong = mpc._checked(lambda: buf.fill_(1.0), ref, "float32")
    assert wrong is None and torch.equal(good, ref)


def test_a_wrong_live_launch_is_reported_not_timed(monkeypatch):
    """measure_config on the tiny model with the route-in-launch path broken: A is timed, B reports the mismatch
    with the reference and nothing after it is timed."""
    from benchmarks.live_e2e import run as le
    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.kernels.workloads import MoEWorkload

    real_prepare = fm.prepare_layer

    def broken(inputs, config, route_in_launch=False):
        fn = real_prepare(inputs, config, route_in_launch)
        return (lambda: fn().mul_(2.0)) if route_in_launch else fn

    monkeypatch.setattr(fm, "prepare_layer", broken)
    m = le.TINY
    wl = MoEWorkload(4, m.num_experts, m.top_k, m.hidden, m.intermediate, 0.0, "float32")
    import torch

    layer_w = [(torch.randn(m.num_experts, 2 * m.intermediate, m.hidden), torch.randn(m.num_experts, m.hidden,
                                                                                       m.intermediate))]
    routing: dict = {}
    (cfg, res), = mpc.measure_tokens(mpc.Measurer(False), wl, "cpu", [str(fm.default_config(wl))], layer_w,
                                     routing, None)
    assert res["A"]["ms"] > 0 and res["error"].startswith("B (route in launch): output 0")
    assert "B" not in res and "C" not in res and "D" in res
