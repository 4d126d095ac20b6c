"""`kernel-gym ui`: the MLflow server on 127.0.0.1 serves the store's experiments and runs over REST, and stops."""

from __future__ import annotations

import json
import urllib.request

import mlflow
import pytest

from kernel_gym.train import tracking
from tests.fakes.mlflow_store import fresh_store


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_ui_serves_the_store_and_stops(tmp_path):
    uri = tracking.setup_tracking(fresh_store(tmp_path))
    exp_id = tracking.get_or_create_experiment("ui-test", uri)
    with mlflow.start_run(experiment_id=exp_id, run_name="r1") as run:
        mlflow.log_metric("eval/geomean_policy", 0.98)
    port = tracking.free_port()
    proc = tracking.start_ui(port, uri)
    try:
        base = tracking.wait_for_ui(port, proc, timeout_s=90)
        assert base == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=ui-test") as r:
            assert json.load(r)["experiment"]["experiment_id"] == exp_id
        req = urllib.request.Request(
            f"{base}/api/2.0/mlflow/runs/search", data=json.dumps({"experiment_ids": [exp_id]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req) as r:
            runs = json.load(r)["runs"]
        assert [x["info"]["run_id"] for x in runs] == [run.info.run_id]
        assert runs[0]["data"]["metrics"][0]["value"] == pytest.approx(0.98)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode is not None
