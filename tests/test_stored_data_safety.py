"""Where a user's data is stored: bad input gets a one-line error naming the problem and the fix, and nothing already
stored is lost (measurement stores, merges, the MLflow store, policy bundles). CPU only.

Read-only files and folders do not stop root, so those checks run their command in a child process without the
capabilities that let root write anywhere (setpriv), or plainly when not root."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.types import OK, Measurement

ROOT = Path(__file__).resolve().parents[1]
CTX = Context("NVIDIA H200", "2.11.0", "3.6.0", "fused_moe", "abc123")


def _rows(n: int, start: int = 0) -> list[Measurement]:
    return [Measurement("fused_moe", f'{{"w":{i}}}', '{"c":1}', OK, median_ms=1.0 + i, spread=0.01, repeats=3)
            for i in range(start, start + n)]


def _store(path: Path, n: int = 5) -> Path:
    with MeasurementStore(path) as s:
        s.put_many(CTX, _rows(n))
    return path


def _count(path: Path) -> int:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return con.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
    finally:
        con.close()


def _cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    from kernel_gym.cli import main

    rc = main(argv)
    return rc, capsys.readouterr().err


def _unprivileged(code: str) -> subprocess.CompletedProcess:
    """Run python code as a user file permissions apply to (root without CAP_DAC_OVERRIDE)."""
    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: read-only files cannot be made read-only for this test")
        cmd = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def _sqlite_with(path: Path, create_table: str) -> Path:
    """A SQLite file holding one table of someone else's schema."""
    con = sqlite3.connect(path)
    con.execute(create_table)
    con.commit()
    con.close()
    return path


def _cli_code(argv: list[str]) -> str:
    return f"import sys; from kernel_gym.cli import main; sys.exit(main({argv!r}))"


# ---- the measurement store ------------------------------------------------------------------------------------------


def test_a_store_opened_for_writing_on_another_database_leaves_it_untouched(tmp_path: Path) -> None:
    """collect --db / tune --db on an MLflow database used to add kernel_gym's tables to it and switch it to WAL."""
    db = _sqlite_with(tmp_path / "mlflow.db", "CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
    before = db.read_bytes()
    with pytest.raises(ValueError, match=r"not a kernel_gym measurement store .*experiments.*pass a store"):
        MeasurementStore(db)
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]


def test_a_store_opened_for_writing_on_a_file_that_is_not_sqlite_is_named(tmp_path: Path) -> None:
    path = tmp_path / "notes.sqlite"
    path.write_text("not a database\n" * 100)
    with pytest.raises(ValueError, match=r"not a SQLite measurement store .*left as it is: pass a new path"):
        MeasurementStore(path)
    assert path.read_text() == "not a database\n" * 100


def test_a_store_of_another_schema_is_refused_before_any_write(tmp_path: Path) -> None:
    db = _sqlite_with(tmp_path / "old.sqlite",
                      "CREATE TABLE measurements (id INTEGER PRIMARY KEY, device TEXT, kernel TEXT)")
    with pytest.raises(ValueError, match="no measurements table with its columns"):  # was: no such column: workload
        MeasurementStore(db)


def test_a_store_locked_by_another_process_names_the_lock(tmp_path: Path) -> None:
    db = _store(tmp_path / "s.sqlite")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a writer mid-transaction (another collect, a merge)
    try:
        with MeasurementStore(db, timeout_s=0.2) as s:
            with pytest.raises(ValueError, match="holds its write lock: wait for it to finish"):
                s.put_many(CTX, _rows(3, start=100))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert _count(db) == 5


def test_merge_into_a_locked_store_names_the_lock_and_keeps_its_rows(tmp_path: Path, capsys,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    src, into = _store(tmp_path / "src.sqlite"), _store(tmp_path / "into.sqlite", 2)
    monkeypatch.setattr(MeasurementStore.__init__, "__defaults__", (0.2, False))  # do not wait 60 s for the lock
    holder = sqlite3.connect(into, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        rc, err = _cli(["data", "--merge", str(src), "--into", str(into)], capsys)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert rc == 2 and "holds its write lock" in err and "Traceback" not in err
    assert _count(into) == 2


def test_merge_into_a_snapshot_name_is_refused(tmp_path: Path, capsys) -> None:
    """--into x.jsonl.gz used to write a SQLite file under a snapshot's name, which every reader then called a
    corrupt snapshot to restore."""
    src = _store(tmp_path / "src.sqlite")
    rc, err = _cli(["data", "--merge", str(src), "--into", str(tmp_path / "merged.jsonl.gz")], capsys)
    assert rc == 2 and "pass --into NEW.sqlite" in err
    assert not (tmp_path / "merged.jsonl.gz").exists()
    with MeasurementStore(src) as s:
        s.export_snapshot(tmp_path / "snap.jsonl.gz")
    before = (tmp_path / "snap.jsonl.gz").read_bytes()
    rc, err = _cli(["data", "--merge", str(src), "--into", str(tmp_path / "snap.jsonl.gz")], capsys)
    assert rc == 2 and "pass --into NEW.sqlite" in err and "restore" not in err
    assert (tmp_path / "snap.jsonl.gz").read_bytes() == before


def test_merge_of_a_folder_names_it(tmp_path: Path, capsys) -> None:
    (tmp_path / "runs").mkdir()
    rc, err = _cli(["data", "--merge", str(tmp_path / "runs"), "--into", str(tmp_path / "m.sqlite")], capsys)
    assert rc == 2 and "(a folder): pass the .sqlite file in it" in err  # was: OperationalError, exit 1


def test_merge_and_drop_row_on_a_read_only_store_name_the_fix(tmp_path: Path) -> None:
    src = _store(tmp_path / "src.sqlite")
    into = _store(tmp_path / "ro" / "into.sqlite", 2)
    os.chmod(into, 0o444)
    os.chmod(into.parent, 0o555)
    try:
        for argv in (["data", "--merge", str(src), "--into", str(into)], ["data", "--db", str(into), "--drop-row", "1"],
                     ["data", "--merge", str(src), "--into", str(tmp_path / "ro" / "new.sqlite")]):
            res = _unprivileged(_cli_code(argv))
            assert res.returncode == 2, res.stderr
            assert "make" in res.stderr and "writable" in res.stderr and "OperationalError" not in res.stderr
    finally:
        os.chmod(into.parent, 0o755)
        os.chmod(into, 0o644)
    assert _count(into) == 2 and not (tmp_path / "ro" / "new.sqlite").exists()


def _store_with_rows_in_its_wal(folder: Path) -> Path:
    """A store whose last 30 rows are committed in its -wal only (a collection killed with kill -9), without -shm."""
    folder.mkdir()
    db = folder / "killed.sqlite"
    _store(db, 5)
    s = MeasurementStore(db)
    s.conn.execute("PRAGMA wal_autocheckpoint=0")
    s.put_many(CTX, _rows(30, start=10))
    copy = folder.parent / "copy"
    copy.mkdir()
    for suffix in ("", "-wal"):  # what the killed process leaves, copied while it still held the file
        shutil.copy(f"{db}{suffix}", copy / f"killed.sqlite{suffix}")
    s.close()
    shutil.rmtree(folder)
    return copy / "killed.sqlite"


def test_a_store_whose_wal_holds_rows_in_a_read_only_folder_is_not_read_without_them(tmp_path: Path) -> None:
    """merge used to read such a store as an immutable file: the rows in its -wal were silently left out."""
    db = _store_with_rows_in_its_wal(tmp_path / "run")
    os.chmod(db.parent, 0o555)
    try:
        res = _unprivileged(_cli_code(["data", "--merge", str(db), "--into", str(tmp_path / "merged.sqlite")]))
    finally:
        os.chmod(db.parent, 0o755)
    assert res.returncode == 2, res.stderr
    assert "copy killed.sqlite and killed.sqlite-wal together to a writable folder" in res.stderr
    assert _count(db) == 35  # in a writable folder every row reads


def test_a_clean_store_in_a_read_only_folder_reads_and_merges(tmp_path: Path) -> None:
    """`data --db` on a WAL store in a read-only folder used to say 'not a readable store: restore it or collect
    again' of a store that was fine."""
    db = _store(tmp_path / "ro" / "s.sqlite", 7)
    os.chmod(db.parent, 0o555)
    code = ("from kernel_gym.measure.store import load_rows; "
            f"print(sum(len(ms) for _, ms in load_rows({str(db)!r})))")
    try:
        res = _unprivileged(code)
        merged = _unprivileged(_cli_code(["data", "--merge", str(db), "--into", str(tmp_path / "m.sqlite")]))
    finally:
        os.chmod(db.parent, 0o755)
    assert res.returncode == 0 and res.stdout.strip() == "7", res.stderr
    assert merged.returncode == 0, merged.stderr
    assert _count(tmp_path / "m.sqlite") == 7


# ---- the MLflow store -----------------------------------------------------------------------------------------------


def test_an_http_tracking_uri_nobody_answers_fails_in_seconds(capsys) -> None:
    from kernel_gym.train import tracking

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[1]
    with socket.socket() as silent:  # accepts connections, never answers: MLflow waited 120 s a request, 8 times
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        for port in (refused, silent.getsockname()[1]):
            t0 = time.monotonic()
            with pytest.raises(ValueError, match="no MLflow server answers .*unset MLFLOW_TRACKING_URI"):
                tracking.setup_tracking(f"http://127.0.0.1:{port}")
            assert time.monotonic() - t0 < 15


def _fake_mlflow_store(db: Path, version: str | None = None) -> None:
    """The tables sqlite_store_problem looks for, at MLflow's current schema version unless given."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    con = sqlite3.connect(db)
    con.execute("CREATE TABLE alembic_version (version_num TEXT)")
    con.execute("INSERT INTO alembic_version VALUES (?)", (version or _get_latest_schema_revision(),))
    con.execute("CREATE TABLE experiments (experiment_id INTEGER)")
    con.execute("CREATE TABLE runs (run_uuid TEXT)")
    con.commit()
    con.close()


def test_a_measurement_store_as_tracking_uri_is_not_moved_aside(tmp_path: Path) -> None:
    """It used to be taken for an MLflow store left half-created: renamed to .broken-DATE and replaced, its -wal left
    beside the new file."""
    from kernel_gym.train import tracking

    db = _store(tmp_path / "measurements.sqlite", 4)
    with pytest.raises(ValueError, match=r"is not an MLflow store .*measurements.*left as it is: pass another"):
        tracking.ensure_sqlite_store(db)
    text = tmp_path / "notes.db"
    text.write_text("hello")
    with pytest.raises(ValueError, match="is not an MLflow store .*left as it is"):  # was: "holds runs: mlflow db
        tracking.ensure_sqlite_store(text)                                           # upgrade" of a text file
    assert sorted(p.name for p in tmp_path.iterdir() if "broken" in p.name) == [] and _count(db) == 4


def test_an_mlflow_store_in_a_read_only_folder_can_be_read(tmp_path: Path) -> None:
    """export / replay of a read-only store failed on the lock file kernel-gym only needs to create a store."""
    folder = tmp_path / "mlruns"
    folder.mkdir()
    _fake_mlflow_store(folder / "mlflow.db")
    os.chmod(folder, 0o555)
    code = ("from pathlib import Path; from kernel_gym.train import tracking; "
            f"tracking.ensure_sqlite_store(Path({str(folder / 'mlflow.db')!r})); print('ok')")
    try:
        res = _unprivileged(code)
        missing = _unprivileged(code.replace("mlruns/mlflow.db", "mlruns/new/mlflow.db"))
    finally:
        os.chmod(folder, 0o755)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    assert missing.returncode != 0 and "in a writable folder" in missing.stderr  # a new store: the fix, in one line
    assert "PermissionError" not in missing.stderr.splitlines()[-1]


def test_an_mlflow_store_of_a_newer_mlflow_is_not_sent_to_mlflow_db_upgrade(tmp_path: Path) -> None:
    from kernel_gym.train import tracking

    db = tmp_path / "mlflow.db"
    _fake_mlflow_store(db, version="ffffffffffff")
    with pytest.raises(ValueError, match="written by a newer MLflow .*cannot migrate it"):
        tracking.setup_tracking(f"sqlite:///{db}")
    older = tmp_path / "older.db"
    _fake_mlflow_store(older, version="451aebb31d03")  # a revision this MLflow knows
    with pytest.raises(ValueError, match=r"older MLflow .*back it up .*mlflow db upgrade sqlite:///"):
        tracking.setup_tracking(f"sqlite:///{older}")


# ---- policy bundles -------------------------------------------------------------------------------------------------


def _bundle_parts() -> tuple[dict, dict, dict]:
    from kernel_gym.train.bundle import load_bundle

    return load_bundle(ROOT / "benchmarks" / "generalisation" / "policies", "decode_attention")


def test_a_bundle_whose_files_come_from_two_saves_is_refused(tmp_path: Path) -> None:
    from kernel_gym.train.bundle import load_bundle, save_bundle

    meta, params, prov = _bundle_parts()
    save_bundle(tmp_path, "decode_attention", meta, params, prov)
    assert load_bundle(tmp_path, "decode_attention")[1].keys() == params.keys()
    other = {k: (v * 0.5 if k.startswith("W") else v) for k, v in params.items()}  # another policy, same shapes
    np.savez(tmp_path / "decode_attention.npz", **other)  # a save cut between its two renames
    with pytest.raises(ValueError, match="different saves.*--save-policies"):
        load_bundle(tmp_path, "decode_attention")


def test_save_policies_into_a_file_names_the_fix(tmp_path: Path) -> None:
    from kernel_gym.train.bundle import save_bundle

    meta, params, prov = _bundle_parts()
    blocker = tmp_path / "policies"
    blocker.write_text("precious")
    with pytest.raises(ValueError, match="--save-policies .*cannot write there .*pass a writable folder"):
        save_bundle(blocker, "decode_attention", meta, params, prov)
    assert blocker.read_text() == "precious"
    json.loads((ROOT / "benchmarks" / "generalisation" / "policies" / "decode_attention.json").read_text())


# ---- export's --out ----------------------------------------------------------------------------------------------

def test_export_refuses_an_out_it_cannot_write_a_folder_to_before_any_work(tmp_path):
    """An existing file or a new "*.json" path as --out failed after ~30 s of work with FileExistsError, or silently
    became a folder named table.json/; both are refused up front and the file is kept."""
    from kernel_gym.deploy.export import check_out_folder

    f = tmp_path / "keep.txt"
    f.write_text("mine")
    with pytest.raises(ValueError, match="is a file: export writes a folder"):
        check_out_folder(f)
    assert f.read_text() == "mine"
    with pytest.raises(ValueError, match="not one JSON file; pass a folder"):
        check_out_folder(tmp_path / "table.json")
    assert not (tmp_path / "table.json").exists()
    check_out_folder(tmp_path / "deploy" / "v1")  # a folder path passes; nothing is created before the work
    assert not (tmp_path / "deploy").exists()
    with pytest.raises(ValueError, match="is a file, so no folder can be made under it"):
        check_out_folder(f / "sub")


def test_data_summary_of_a_row_whose_workload_the_kernel_cannot_read_names_the_fix(tmp_path, capsys):
    """Was: TypeError: MoEWorkload.__init__() got an unexpected keyword argument 'w' (exit 1)."""
    store = _store(tmp_path / "odd.sqlite", 1)
    rc, err = _cli(["data", "--db", str(store)], capsys)
    assert rc != 0 and "cannot read" in err and "--drop-row" in err and "TypeError" not in err.splitlines()[0]
    assert _count(store) == 1
