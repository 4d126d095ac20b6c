"""The live training run's log and its MLflow import, on CPU: a stand-in backend named "live" answers from the recorded
H200 data with a deterministic per-call jitter, so the env takes its live path (measure every step, best known time
improves) without a GPU."""

from __future__ import annotations

import json
from dataclasses import replace

import mlflow
import pytest

from kernel_gym.measure.recorded import RecordedBackend  # noqa: E402
from kernel_gym.train import live_run  # noqa: E402
from tests.fakes.mlflow_store import fresh_store

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class JitteredRecorded:
    """Looks live (name, nondeterministic); times are the recorded ones times 0.97..1.03."""

    name = "live"
    deterministic = False
    device = "stand-in"

    def __init__(self) -> None:
        self.inner = RecordedBackend()
        self.calls = 0

    def measure(self, kernel, workload, config):
        return self.measure_many(kernel, workload, [config])[0]

    def measure_many(self, kernel, workload, configs):
        out = []
        for c in configs:
            self.calls += 1
            m = self.inner.measure(kernel, workload, c)
            if m.ok:
                m = replace(m, median_ms=m.median_ms * (0.97 + 0.06 * ((self.calls * 7919) % 101) / 100))
            out.append(m)
        return out

    def available_configs(self, kernel, workload):
        return self.inner.available_configs(kernel, workload)


def test_live_log_and_mlflow_import(tmp_path, monkeypatch):
    backend = JitteredRecorded()
    log = live_run.run_live(tmp_path / "live.json", timesteps=32, n_steps=16, train_workloads=4, eval_workloads=3,
                            backend=backend)
    assert backend.calls >= 32  # every training step measured (no cached answers on the live path)
    on_disk = json.loads((tmp_path / "live.json").read_text())
    assert on_disk["format"] == live_run.LOG_FORMAT and len(on_disk["steps"]) == 32
    assert (tmp_path / "live_policy.zip").stat().st_size > 0
    assert len(on_disk["updates"]) >= 1 and any("train/loss" in u for u in on_disk["updates"])
    for s in on_disk["steps"]:
        assert s["config"] in on_disk["catalogue"] and s["workload"] in on_disk["train_workloads"]
        assert 0 < s["reward"] <= 1.0 + 1e-9 and s["best_ms"] <= s["time_ms"]
    splits = {r["split"] for r in log["evaluation"]}
    assert splits == {"heldout", "train"}
    s = log["summary"]
    assert s["steps"] == 32 and 0 < s["heldout_live_geomean_policy_vs_recorded_oracle"] < 1.2

    monkeypatch.setenv("MLFLOW_TRACKING_URI", fresh_store(tmp_path))
    run_id = live_run.import_log(tmp_path / "live.json")
    run = mlflow.get_run(run_id)
    assert run.data.params["env_id"] == "KernelGym/MoE-live-v0" and run.data.tags["data.backend"] == "live"
    hist = mlflow.MlflowClient().get_metric_history(run_id, "live/reward")
    assert len(hist) == 32
    names = {a.path for a in mlflow.MlflowClient().list_artifacts(run_id)}
    assert {"live.json", "live_policy.zip", "plots"} <= names


def test_import_rejects_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="not 'kernel_gym-live-run'"):
        live_run.import_log(p)
