"""MLflow plumbing: default store location, SB3 metrics into MLflow, code version."""

from __future__ import annotations

import mlflow
import pytest
from stable_baselines3.common.logger import Logger

from kernel_gym.train import tracking
from tests.fakes.mlflow_store import fresh_store


def test_default_store_is_sqlite_under_mlruns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri, artifacts = tracking.default_store()
    assert uri == f"sqlite:///{tmp_path.resolve() / 'mlruns' / 'mlflow.db'}"
    assert artifacts == (tmp_path.resolve() / "mlruns" / "artifacts").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'other.db'}")
    assert tracking.setup_tracking() == f"sqlite:///{tmp_path / 'other.db'}"


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_sb3_logger_values_become_mlflow_metrics(tmp_path):
    uri = tracking.setup_tracking(fresh_store(tmp_path, "m.db"))
    exp = tracking.get_or_create_experiment("kv", uri)
    assert mlflow.get_experiment(exp).artifact_location == (tmp_path / "artifacts").resolve().as_uri()
    with mlflow.start_run(experiment_id=exp) as run:
        writer = tracking.MLflowOutputFormat(run.info.run_id)
        logger = Logger(folder=None, output_formats=[writer])
        for step, value in ((100, 0.5), (200, 0.75)):
            logger.record("rollout/ep_rew_mean", value)
            logger.record("train/note", "text is skipped")
            logger.record("time/secret", 1.0, exclude="mlflow")
            logger.dump(step)
    history = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "rollout/ep_rew_mean")
    assert [(m.step, m.value) for m in history] == [(100, 0.5), (200, 0.75)]
    metrics = mlflow.get_run(run.info.run_id).data.metrics
    assert "train/note" not in metrics and "time/secret" not in metrics
    assert writer.history["rollout/ep_rew_mean"] == [(100, 0.5), (200, 0.75)]


def test_git_commit_names_head():
    commit = tracking.git_commit()
    assert commit == "unknown" or len(commit.removesuffix("-dirty")) == 40
