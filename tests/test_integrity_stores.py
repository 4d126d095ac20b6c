"""One device and one kernel source per price, and stores that survive a kill (issue 25 items 3 and 4)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.measure.recorded import RecordedBackend, current_source_hash
from kernel_gym.measure.store import Context
from kernel_gym.measure.types import OK, Measurement
from kernel_gym.train import tracking


def rows(ms: float, n: int = 3) -> list[Measurement]:
    return [Measurement("fused_moe", MoEWorkload(t, 8, 2, 64, 96).key(), '{"BLOCK_M":16}', OK, median_ms=ms * t,
                        spread=0.01, repeats=3) for t in (1, 2, 4, 8)[:n]]


def test_a_store_of_two_devices_is_refused_without_device():
    h200 = Context("NVIDIA H200", "2.11", "3.6", "fused_moe", "h1")
    a100 = Context("NVIDIA A100", "2.11", "3.6", "fused_moe", "h1")
    groups = [(h200, rows(1.0, 2)), (a100, rows(2.2, 4))]
    with pytest.raises(ValueError, match=r"2 devices \('NVIDIA A100': 4 rows, 'NVIDIA H200': 2 rows\): pass --device"):
        RecordedBackend(groups=groups, check_validity=False)
    b = RecordedBackend(groups=groups, device="NVIDIA H200", check_validity=False)
    assert b.device == "NVIDIA H200" and b.describe()["kernels"]["fused_moe"]["rows"] == 2
    assert "device NVIDIA H200" in b.describe_line()


def test_rows_of_the_current_source_price_even_when_fewer_and_the_mix_is_announced(capsys):
    current = current_source_hash("fused_moe")
    assert current
    old = Context("NVIDIA H200", "2.11", "3.6", "fused_moe", "0ld0ld0ld0ld0ld0")
    new = Context("NVIDIA H200", "2.11", "3.6", "fused_moe", current)
    b = RecordedBackend(groups=[(old, rows(1.0, 4)), (new, rows(3.0, 2))], check_validity=False)
    assert b.contexts["fused_moe"].source_hash == current
    assert b.describe()["kernels"]["fused_moe"]["source_hash"] == current
    (note,) = b.notes
    assert "0ld0ld0ld0ld0ld0" in note and "the current code" in note
    assert "warning: recorded data" in capsys.readouterr().err  # every user of the backend is told
    # without rows of the current source: the most rows, still announced
    other = Context("NVIDIA H200", "2.11", "3.6", "fused_moe", "0th3r0th3r0th3r0")
    b = RecordedBackend(groups=[(old, rows(1.0, 4)), (other, rows(3.0, 2))], check_validity=False)
    assert b.contexts["fused_moe"].source_hash == "0ld0ld0ld0ld0ld0" and len(b.notes) == 1


def test_replay_prints_the_device_and_source_it_prices_with(tmp_path, capsys):
    from kernel_gym.cli import main

    rc = main(["replay", "--trace", "bundled", "--policies", "default", "--json", str(tmp_path / "r.json"),
               "--no-mlflow", "--window", "0:20"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "recorded data: device NVIDIA H200; " in err and "fused_moe source " in err
    import json

    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["priced_by"]["device"] == "NVIDIA H200" and rep["priced_by"]["kernels"]["fused_moe"]["source_hash"]


# ---- the MLflow store ------------------------------------------------------------------------------------------------


def template(tmp_path: Path) -> Path:
    from tests.fakes.mlflow_store import fresh_store

    return Path(fresh_store(tmp_path, "template.db").removeprefix("sqlite:///"))


def fake_create(src: Path):
    def create(path: Path) -> None:
        shutil.copy(src, path)

    return create


def test_a_store_left_half_created_is_moved_aside_and_recreated(tmp_path, monkeypatch, capsys):
    src = template(tmp_path)
    db = tmp_path / "mlruns" / "mlflow.db"
    db.parent.mkdir()
    shutil.copy(src, db)
    with sqlite3.connect(db) as con:  # what a kill -9 inside MLflow's migrations leaves
        con.execute("CREATE TABLE _alembic_tmp_experiments (x INTEGER)")
    assert "_alembic_tmp_experiments" in tracking.sqlite_store_problem(db)
    monkeypatch.setattr(tracking, "_create_store", fake_create(src))
    tracking.ensure_sqlite_store(db)
    assert tracking.sqlite_store_problem(db) is None
    assert list(db.parent.glob("mlflow.db.broken-*")) and "moved aside" in capsys.readouterr().err


def test_a_kill_during_creation_leaves_no_store_behind(tmp_path, monkeypatch):
    db = tmp_path / "mlruns" / "mlflow.db"

    def killed(path: Path) -> None:
        path.write_bytes(b"SQLite format 3\x00 half")
        raise KeyboardInterrupt  # stands in for the kill: nothing after this line runs

    monkeypatch.setattr(tracking, "_create_store", killed)
    with pytest.raises(KeyboardInterrupt):
        tracking.ensure_sqlite_store(db)
    assert not db.exists()  # the next run creates it from scratch
    monkeypatch.setattr(tracking, "_create_store", fake_create(template(tmp_path)))
    tracking.ensure_sqlite_store(db)
    assert tracking.sqlite_store_problem(db) is None


def test_a_damaged_store_with_runs_is_refused_with_the_repair(tmp_path, monkeypatch):
    db = tmp_path / "mlflow.db"
    shutil.copy(template(tmp_path), db)
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE _alembic_tmp_runs (x INTEGER)")
    monkeypatch.setattr(tracking, "_store_is_empty", lambda db: False)
    with pytest.raises(ValueError, match="holds runs: back it up, then repair it with `mlflow db upgrade"):
        tracking.ensure_sqlite_store(db)


def test_a_file_that_is_not_a_store_is_named(tmp_path):
    db = tmp_path / "x.db"
    db.write_text("hello")
    assert "not a sqlite database" in tracking.sqlite_store_problem(db)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as con:
        con.execute("CREATE TABLE measurements (x INTEGER)")
    assert "not an MLflow store" in tracking.sqlite_store_problem(other)
