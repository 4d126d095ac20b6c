"""`kernel-gym ui` opens on the runs: every experiment is tagged as model development (MLflow 3's runs view, not its
GenAI overview) and the runs page of each experiment with runs is listed; MLflow's type-hint warning is silenced."""

from __future__ import annotations

import warnings

import mlflow
import pytest

from kernel_gym import cli
from kernel_gym.cli import ui
from kernel_gym.train import tracking
from tests.fakes.mlflow_store import fresh_store


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
def test_runs_pages_tag_experiments_for_the_runs_view(tmp_path):
    uri = tracking.setup_tracking(fresh_store(tmp_path))
    train = tracking.get_or_create_experiment("kernel-gym", uri)
    empty = tracking.get_or_create_experiment("kernel-gym-empty", uri)
    with mlflow.start_run(experiment_id=train, run_name="moe-v0-mixtral-8x7b-seed0"):
        mlflow.log_metric("x", 1.0)
    pages = ui.runs_pages(uri)
    assert ("kernel-gym", train, 1) in pages and all(exp_id != empty for _, exp_id, _ in pages)
    client = mlflow.tracking.MlflowClient(uri)
    for exp_id in (train, empty):
        assert client.get_experiment(exp_id).tags[ui.EXPERIMENT_KIND_TAG] == ui.RUNS_KIND
    client.set_experiment_tag(empty, ui.EXPERIMENT_KIND_TAG, "genai_development")  # a user's choice is kept
    ui.runs_pages(uri)
    assert client.get_experiment(empty).tags[ui.EXPERIMENT_KIND_TAG] == "genai_development"


def test_type_hint_warning_is_silenced():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli.quiet_known_warnings()
        warnings.warn("\x1b[33mAdd type hints to the `predict` method to enable data validation\x1b[0m", UserWarning,
                      stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["another warning"]
