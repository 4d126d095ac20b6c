"""Replay evaluation through `run_replay` (what `kernel-gym replay` calls): every policy on a tiny trace over the
analytic test backend, the JSON schema, markdown and plots beside it, MLflow logging, per-step export for the live
check, clear errors."""

from __future__ import annotations

import json

import mlflow
import pytest

from kernel_gym.deploy.export import build_table  # noqa: E402
from kernel_gym.dispatch.baselines import Oracle  # noqa: E402
from kernel_gym.dispatch.rules import default_for  # noqa: E402
from kernel_gym.evaluate import replay  # noqa: E402
from kernel_gym.measure.coverage import CoveredBackend  # noqa: E402
from kernel_gym.models import BUILTIN_MODELS  # noqa: E402
from kernel_gym.traffic import load_trace  # noqa: E402
from tests.fakes.analytic_backend import AnalyticBackend

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
MODEL = BUILTIN_MODELS["mixtral-8x7b"]


@pytest.fixture(scope="module")
def backend():
    return AnalyticBackend(sample=400)  # enough configs that every KV layout has some on every shape


@pytest.fixture(scope="module")
def table_path(backend, tmp_path_factory):
    """A table whose MoE choices are the oracle's on each bucket (what a perfect policy would export)."""
    oracle = Oracle(CoveredBackend(backend))
    table = build_table(MODEL, {
        "fused_moe": (lambda ws: [oracle.best("fused_moe", w) for w in ws], {"model_uri": "test-oracle"}),
        "decode_attention": (lambda ws: [default_for("decode_attention", w, None) for w in ws], {}),
    })
    return table.save(tmp_path_factory.mktemp("tbl") / "dispatch_table.json")


@pytest.fixture(scope="module")
def result(backend, table_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("replay")
    uri = f"sqlite:///{out / 'mlflow.db'}"
    replay.run_replay(trace="bundled", window="0:20", policies=",".join(replay.POLICY_NAMES),
                      json_path=out / "replay.json", table=str(table_path), routing="zipf:1.2", tracking_uri=uri,
                      steps_json=out / "steps.json", steps=50, backend=backend, untimed_plan=out / "untimed.json")
    return out, uri, json.loads((out / "replay.json").read_text())


def test_untimed_plan_is_written_for_collect(result):
    """--untimed-plan: a plan `collect --plan` accepts (possibly empty: every choice timed), beside the JSON."""
    from kernel_gym.measure.collect import load_plan_file

    out, _, _ = result
    plan = json.loads((out / "untimed.json").read_text())
    assert isinstance(plan, list)
    kernels = sorted({e["kernel"] for e in plan})
    assert len(load_plan_file(str(out / "untimed.json"), kernels)) == len(plan)


def test_json_has_every_policy_and_metric(result):
    _, _, rep = result
    assert rep["model"] == "mixtral-8x7b" and rep["trace"].startswith("bundled")
    assert list(rep["policies"]) == list(replay.POLICY_NAMES)
    for name, m in rep["policies"].items():
        for k in replay.METRICS:
            assert isinstance(m[k], float) and m[k] == m[k], (name, k)
        assert m["tokens_per_s"] > 0 and m["tuned_kernel_s"] > 0


def test_tuning_costs_and_stalls_are_accounted(result):
    _, _, rep = result
    p = rep["policies"]
    for n in ("default", "static", "vllm-table", "learned", "oracle"):
        assert p[n]["tuning_gpu_s"] == 0.0 and p[n]["measurements"] == 0
    assert p["autotune"]["tuning_gpu_s"] > p["random"]["tuning_gpu_s"] > 0
    assert p["tpe"]["tuning_gpu_s"] > 0 and p["tpe"]["measurements"] <= p["random"]["measurements"] + 8
    assert p["autotune"]["stall_s"] >= p["autotune"]["tuning_gpu_s"] * 0.999
    assert p["oracle"]["stall_s"] == 0.0
    # the oracle's kernels are never slower than autotune's per-shape winners or the fixed tables', per step
    per_step = {n: m["tuned_kernel_s.fused_moe"] / m["steps"] for n, m in p.items()}
    assert per_step["oracle"] <= min(per_step[n] for n in ("default", "static", "vllm-table")) * 1.0001
    assert per_step["learned"] <= per_step["default"]


def test_markdown_plots_steps_and_mlflow(result):
    out, uri, rep = result
    md = (out / "replay.md").read_text()
    assert md.count("\n| ") == len(replay.POLICY_NAMES) + 1 and "| learned |" in md
    for png in ("replay_tokens.png", "replay_switches.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    steps = json.loads((out / "steps.json").read_text())
    assert set(steps["policies"]) == {"default", "learned", "oracle"} and steps["num_layers"] == 32
    first = steps["policies"]["learned"][0]
    assert {"t_s", "kernel", "workload", "config", "predicted_s"} <= set(first) and first["predicted_s"] > 0
    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["kernel-gym-replay"])
    assert len(runs) == 1
    run_id = runs.iloc[0]["run_id"]
    client = mlflow.tracking.MlflowClient()
    data = client.get_run(run_id).data
    assert data.metrics["learned/tokens_per_s"] == pytest.approx(rep["policies"]["learned"]["tokens_per_s"])
    arts = {a.path for a in client.list_artifacts(run_id)} | {a.path for a in client.list_artifacts(run_id, "plots")}
    assert {"replay.json", "replay.md", "plots/replay_tokens.png", "plots/replay_switches.png"} <= arts


def test_errors_are_clear(backend, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown \\['fastest'\\]"):
        replay.run_replay(policies="default,fastest", json_path=tmp_path / "x.json", backend=backend)
    with pytest.raises(ValueError, match="--routing"):
        replay.routing_profile("pareto:1", MODEL)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(ValueError, match="kernel-gym train"):
        replay.run_replay(policies="learned", window="0:5", json_path=tmp_path / "x.json", no_mlflow=True,
                          backend=backend)


def test_learned_table_matching_the_oracle_tracks_it_on_moe(backend, table_path):
    trace = load_trace("bundled").window(0, 15)
    cov = CoveredBackend(backend)
    from kernel_gym.dispatch.baselines import make_baselines

    fac = make_baselines(["oracle"], cov, MODEL)
    fac["learned"] = lambda: replay.learned_policy(MODEL, table_path=str(table_path))
    runs = replay.replay(trace, MODEL, fac, cov, replay.routing_profile("uniform", MODEL), progress=False)
    lm, om = runs["learned"].metrics, runs["oracle"].metrics
    ratio = (om["tuned_kernel_s.fused_moe"] / om["steps"]) / (lm["tuned_kernel_s.fused_moe"] / lm["steps"])
    assert ratio > 0.9  # bucketed oracle choices stay close to per-workload oracle choices
