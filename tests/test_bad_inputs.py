"""Bad inputs through the `kernel-gym` CLI: each exits non-zero with one line naming the bad value and the fix, never
a traceback (`kernel-gym --debug` shows one); files that are only read are never written."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_gym.cli import main
from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.types import OK, Measurement
from kernel_gym.traffic.traces import load_azure

BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc != 0, err
    lines = [ln for ln in err.splitlines() if "error" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def burst(tmp_path: Path, rows: list[str], name: str = "burst.csv") -> Path:
    path = tmp_path / name
    path.write_text(BURST_HEADER + "".join(r + "\n" for r in rows))
    return path


def replay(trace: Path | str, tmp_path: Path, *extra: str) -> list[str]:
    return ["replay", "--trace", str(trace), "--policies", "default", "--json", str(tmp_path / "r.json"),
            "--no-mlflow", *extra]


# ---- traces ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stamp", ["nan", "inf", "-inf"])
def test_non_finite_timestamp(tmp_path, capsys, stamp) -> None:
    path = burst(tmp_path, ["0,ChatGPT,10,5,15,Conversation log", f"{stamp},ChatGPT,10,5,15,Conversation log"])
    one_line_error(*run_cli(replay(path, tmp_path), capsys)[::2], f"{path}:3", "not a finite time")


@pytest.mark.parametrize("count", ["inf", "1e30", "nan"])
def test_implausible_token_counts(tmp_path, capsys, count) -> None:
    path = burst(tmp_path, ["0,ChatGPT,10,5,15,Conversation log", f"1,ChatGPT,{count},5,15,Conversation log"])
    one_line_error(*run_cli(replay(path, tmp_path), capsys)[::2], f"{path}:3", "Request tokens")


def test_azure_offset_is_kept(tmp_path) -> None:
    path = tmp_path / "az.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.5000000+05:00,10,5\n"  # 13:15:46.5 UTC
                    "2023-11-16 13:15:47.5000000,10,5\n"  # UTC: one second later
                    "2023-11-16T13:15:49Z,10,5\n")
    tr = load_azure(path)
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 1.0, 2.5])


def test_non_utf8_trace(tmp_path, capsys) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(BURST_HEADER.encode() + "0,Chat\xe9GPT,10,5,15,Conversation log\n".encode("latin-1"))
    one_line_error(*run_cli(replay(path, tmp_path), capsys)[::2], str(path), "UTF-8")


def test_trace_directory(tmp_path, capsys) -> None:
    one_line_error(*run_cli(replay(tmp_path, tmp_path), capsys)[::2], "a directory", "--trace")


def test_json_directory_is_refused_before_the_replay(tmp_path, capsys) -> None:
    argv = ["replay", "--trace", "bundled", "--policies", "default", "--json", str(tmp_path), "--no-mlflow"]
    rc, out, err = run_cli(argv, capsys)
    one_line_error(rc, err, "--json", "a directory")
    assert "routing profile" not in err and not list(tmp_path.iterdir())  # nothing ran, nothing written


def test_bad_tracking_uri(tmp_path, capsys) -> None:
    argv = ["replay", "--trace", "bundled", "--json", str(tmp_path / "r.json"), "--tracking-uri", "bogus-store"]
    one_line_error(*run_cli(argv, capsys)[::2], "tracking URI 'bogus-store'")
    argv[-1] = f"sqlite:///{tmp_path}/missing/mlflow.db"
    one_line_error(*run_cli(argv, capsys)[::2], "does not exist")


def test_dropped_rows_routing_and_estimated_share_are_reported(tmp_path, capsys) -> None:
    path = burst(tmp_path, ["0,ChatGPT,100,20,120,Conversation log", "1,ChatGPT,0,0,0,Conversation log",
                            "2,ChatGPT,50,10,60,Conversation log", "3,ChatGPT,80,0,80,Conversation log"])
    rc, out, err = run_cli(replay(path, tmp_path, "--routing", "zipf:1.2"), capsys)
    assert rc == 0, err
    assert "2 rows dropped (zero prompt or output tokens" in err
    assert "routing profile: zipf:1.2" in err and "Expert routing: zipf:1.2" in out
    rep = json.loads((tmp_path / "r.json").read_text())
    assert 0.0 <= rep["policies"]["default"]["estimated_share"] <= 1.0


def test_spec_without_data_under_default_policy(tmp_path, capsys) -> None:
    spec = tmp_path / "odd.json"
    spec.write_text(json.dumps({"name": "odd", "num_layers": 32, "hidden": 1000, "num_heads": 32, "num_kv_heads": 8,
                                "head_dim": 128, "num_experts": 6, "top_k": 2, "intermediate": 3000,
                                "dtype_bytes": 2}))
    path = burst(tmp_path, ["0,ChatGPT,100,20,120,Conversation log", "2,ChatGPT,50,10,60,Conversation log"])
    # refused before the replay (it stopped mid-run at the first call), with the commands that measure the kernel
    one_line_error(*run_cli(replay(path, tmp_path, "--model", str(spec)), capsys)[::2],
                   "holds no measurement of fused_moe", "kernel-gym tune --model SPEC --kernels fused_moe")


# ---- stores ----------------------------------------------------------------------------------------------------------


def _snapshot(tmp_path: Path, median: float, name: str = "s.jsonl.gz") -> Path:
    path = tmp_path / name
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"format": "kernel_gym-measurements", "version": 1,
                            "fields": ["workload", "config", "status", "median_ms", "spread", "repeats", "compile_s",
                                       "reason", "source"]}) + "\n")
        f.write(json.dumps({"context": {"device": "d", "torch_version": "t", "triton_version": "t",
                                        "kernel": "fused_moe", "source_hash": "h"}}) + "\n")
        f.write(json.dumps(['{"w":1}', '{"c":1}', OK, 0.5, 0.01, 3, 0.1, "", "live"]) + "\n")
        f.write(json.dumps(['{"w":1}', '{"c":2}', OK, median, 0.01, 3, 0.1, "", "live"]) + "\n")
    return path


@pytest.mark.parametrize("median", [-5.0, 1e-9, float("nan"), float("inf")])
def test_implausible_stored_times_are_rejected_on_load(tmp_path, capsys, median) -> None:
    path = _snapshot(tmp_path, median)
    one_line_error(*run_cli(["data", "--db", str(path)], capsys)[::2], f"{path}: line 4", "median_ms")


def test_tiny_time_in_a_sqlite_store_is_rejected(tmp_path, capsys) -> None:
    db = tmp_path / "m.sqlite"
    with MeasurementStore(db) as store:
        store.put_many(Context("d", "t", "t", "fused_moe", "h"),
                       [Measurement("fused_moe", '{"w":1}', '{"c":1}', OK, median_ms=1e-9, spread=0.0, repeats=3)])
    one_line_error(*run_cli(["data", "--db", str(db)], capsys)[::2], f"{db}: row id 1", "median_ms 1e-09",
                   "--drop-row 1")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_data_on_an_empty_file_writes_nothing(tmp_path, capsys) -> None:
    db = tmp_path / "empty.sqlite"
    db.write_bytes(b"")
    one_line_error(*run_cli(["data", "--db", str(db)], capsys)[::2], "not a kernel_gym measurement store")
    assert db.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == ["empty.sqlite"]


def test_data_on_an_mlflow_db_writes_no_tables(tmp_path, capsys) -> None:
    db = tmp_path / "mlflow.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
    con.commit()
    con.close()
    before = _digest(db)
    one_line_error(*run_cli(["data", "--db", str(db)], capsys)[::2], "not a kernel_gym measurement store",
                   "experiments")
    assert _digest(db) == before
    con = sqlite3.connect(db)
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["experiments"]
    con.close()


def test_truncated_sqlite_store(tmp_path, capsys) -> None:
    db = tmp_path / "m.sqlite"
    with MeasurementStore(db) as store:
        store.put_many(Context("d", "t", "t", "fused_moe", "h"),
                       [Measurement("fused_moe", f'{{"w":{i}}}', '{"c":1}', OK, median_ms=1.0 + i, spread=0.0,
                                    repeats=3, reason="x" * 500) for i in range(400)])
    for extra in db.parent.glob("m.sqlite-*"):
        extra.unlink()
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 2])
    one_line_error(*run_cli(["data", "--db", str(db)], capsys)[::2], str(db))


def test_truncated_gzip_snapshot(tmp_path, capsys) -> None:
    path = _snapshot(tmp_path, 1.0)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 20])
    one_line_error(*run_cli(["data", "--db", str(path)], capsys)[::2], str(path), "truncated or corrupt")


def test_debug_flag_shows_the_traceback(tmp_path) -> None:
    db = tmp_path / "empty.sqlite"
    db.write_bytes(b"")
    with pytest.raises(ValueError, match="not a kernel_gym measurement store"):
        main(["--debug", "data", "--db", str(db)])


# ---- ui --------------------------------------------------------------------------------------------------------------


def test_ui_port_out_of_range(capsys) -> None:
    one_line_error(*run_cli(["ui", "--port", "99999"], capsys)[::2], "--port 99999", "1-65535")


def test_ui_on_a_port_in_use_fails_without_a_url(capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        rc, out, err = run_cli(["ui", "--port", str(port)], capsys)
    one_line_error(rc, err, f"--port {port} is in use")
    assert "http://" not in out


@pytest.mark.slow
def test_sigterm_stops_the_ui_and_its_server(tmp_path) -> None:
    from kernel_gym.train.tracking import free_port
    from tests.fakes.mlflow_store import fresh_store

    port = free_port()
    env = dict(os.environ, MLFLOW_TRACKING_URI=fresh_store(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "kernel_gym.cli", "ui", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()  # printed once the server answers
        assert f"http://127.0.0.1:{port}" in line, line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with socket.socket() as s:  # the MLflow server child is gone: its port is free again (30 s: a loaded machine)
        for _ in range(300):
            try:
                s.bind(("127.0.0.1", port))
                break
            except OSError:
                time.sleep(0.1)
        else:
            pytest.fail(f"port {port} still held after SIGTERM: the MLflow server outlived kernel-gym ui")


def test_programmatic_trace_with_a_nan_arrival_is_refused() -> None:
    import numpy as np

    from kernel_gym.traffic.traces import Trace

    with pytest.raises(ValueError, match=r"arrival_s\[1\] is nan"):
        Trace("t", np.array([0.0, np.nan, 2.0]), np.array([1, 1, 1]), np.array([1, 1, 1]))


# ---- unseen models and tune ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, needle", [
    (["tune", "--model", "nope", "--dry-run"], "unknown model 'nope'"),
    (["tune", "--model", "mixtral-8x7b@tp3", "--dry-run"], "does not split tp=3 ways"),
    (["tune", "--model", "phi-3.5-moe", "--top-k", "0"], "--top-k must be >= 1"),
    (["tune", "--model", "phi-3.5-moe", "--policy-dir", "/nonexistent/kg", "--dry-run"], "--save-policies"),
    (["train", "--model", "zoo", "--exclude-models", "foo"], "unknown zoo model(s) ['foo']"),
    (["export", "--model", "my_moe.json", "--out", "unused"], "model spec file 'my_moe.json' does not exist"),
])
def test_tune_and_zoo_inputs(capsys, argv, needle) -> None:
    one_line_error(*run_cli(argv, capsys)[::2], needle)


def test_replay_of_a_model_without_data_is_refused_in_one_line(tmp_path, capsys) -> None:
    rc, _, err = run_cli(["replay", "--trace", "bundled", "--model", "phi-3.5-moe", "--policies", "static",
                          "--window", "0:30", "--json", str(tmp_path / "r.json"), "--no-mlflow"], capsys)
    one_line_error(rc, err, "holds no measurement of", "kernel-gym tune")


# ---- issue 25: tables and policies a user receives ---------------------------------------------------------------


def test_replay_table_relabelled_for_another_model_is_refused(tmp_path, capsys) -> None:
    from kernel_gym.deploy.export import build_table
    from kernel_gym.kernels import get_family
    from kernel_gym.models import BUILTIN_MODELS

    fam = get_family("fused_moe")
    table = build_table(BUILTIN_MODELS["mixtral-8x7b"], {"fused_moe": (lambda ws: [fam.default_config(w) for w in ws],
                                                                       {})})
    data = table.to_dict()
    data["model"] = {**data["model"], "name": "olmoe-1b-7b"}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    argv = ["replay", "--trace", "bundled", "--policies", "learned", "--table", str(path), "--model", "olmoe-1b-7b",
            "--json", str(tmp_path / "r.json"), "--no-mlflow"]
    one_line_error(*run_cli(argv, capsys)[::2], f"--table {path}", "made for another shape")


def test_tune_without_a_gpu_says_where_to_run_it_before_any_work(capsys, monkeypatch) -> None:
    """The measuring tune on a machine with no CUDA GPU: one line naming the GPU machine, --dry-run and export, not
    an assertion from torch after the policies were loaded and the plan built."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["tune", "--model", "phi-3.5-moe", "--policy-dir", "/nonexistent/kg"]
    one_line_error(*run_cli(argv, capsys)[::2], "tune measures configs on a CUDA GPU and this machine has none")


def test_a_window_that_ends_before_it_starts_says_so() -> None:
    from kernel_gym.traffic.traces import load_trace

    trace = load_trace("bundled")
    with pytest.raises(ValueError, match=r"END must be after START"):
        trace.window(300.0, 100.0)
