"""`kernel-gym ui`: the MLflow server on 127.0.0.1 serves the store's experiments and runs over REST, and stops."""

from __future__ import annotations

import json
import time
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
        tracking.stop_ui(proc, grace_s=30)
    assert proc.returncode is not None


def test_stop_ui_stops_a_child_that_ignores_sigterm():
    """The MLflow server is a CLI with a uvicorn child holding the port: stop_ui ends the whole group, even a child
    still alive after the grace (a loaded CI machine once left it serving the port after kernel-gym ui exited)."""
    import os
    import subprocess
    import sys

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    parent = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', {stubborn!r}]); "
              "print(c.pid, flush=True); time.sleep(600)")
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = int(proc.stdout.readline())
    tracking.stop_ui(proc, grace_s=1)
    assert proc.returncode is not None
    for _ in range(100):  # the killed child is reaped by init; it is gone once kill(pid, 0) fails
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:  # a zombie awaiting its reaper counts as stopped
            if f.read().split(") ")[1].startswith("Z"):
                break
        time.sleep(0.1)
    else:
        raise AssertionError(f"child {child} still running after stop_ui")
