"""The SQLite store: unique keys, invariants, snapshot round trip, and surviving kill -9 mid-collection."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_gym.measure.store import Context, MeasurementStore, iter_snapshot, load_rows
from kernel_gym.measure.types import COMPILE_ERROR, OK, Measurement

ROOT = Path(__file__).resolve().parents[2]
CTX = Context("NVIDIA H200", "2.11.0", "3.6.0", "fused_moe", "abc123")


def _m(w: str, c: str, t: float | None = 1.0, status: str = OK) -> Measurement:
    return Measurement("fused_moe", w, c, status, median_ms=t, spread=0.01, repeats=3, compile_s=0.2,
                       reason="" if status == OK else "boom")


def test_insert_or_ignore_and_done_keys(tmp_path: Path) -> None:
    with MeasurementStore(tmp_path / "s.sqlite") as store:
        assert store.put_many(CTX, [_m("w1", "c1"), _m("w1", "c2", None, COMPILE_ERROR)]) == 2
        # same key again (even with another time) is ignored: rows are append-only
        assert store.put_many(CTX, [_m("w1", "c1", 5.0), _m("w2", "c1")]) == 1
        assert store.count() == 3 and store.count(status=OK) == 2
        assert store.done_keys(CTX) == {("w1", "c1"), ("w1", "c2"), ("w2", "c1")}
        other = Context("NVIDIA H200", "2.11.0", "3.6.0", "fused_moe", "def456")  # kernel source changed
        assert store.done_keys(other) == set()
        assert store.put_many(other, [_m("w1", "c1", 2.0)]) == 1
        assert store.integrity_check() == "ok"
        assert [r["median_ms"] for r in store.rows() if r["source_hash"] == "abc123" and r["config"] == "c1"
                and r["workload"] == "w1"] == [1.0]
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_invariants_reject_bad_rows(tmp_path: Path) -> None:
    with MeasurementStore(tmp_path / "s.sqlite") as store:
        with pytest.raises(sqlite3.IntegrityError):
            store.put_many(CTX, [_m("w1", "c1", None, OK)])  # ok without a time
        assert store.count() == 0  # the failed batch left nothing behind
        with pytest.raises(ValueError, match="context for"):
            store.put_many(CTX, [Measurement("decode_attention", "w", "c", OK, median_ms=1.0)])


def test_snapshot_round_trip(tmp_path: Path) -> None:
    rows = [_m(f"w{i}", f"c{j}", 0.1 * (i + j + 1)) for i in range(5) for j in range(4)] + [
        _m("w9", "c0", None, COMPILE_ERROR)]
    with MeasurementStore(tmp_path / "a.sqlite") as a:
        a.put_many(CTX, rows)
        assert a.export_snapshot(tmp_path / "snap.jsonl.gz") == len(rows)
    groups = list(iter_snapshot(tmp_path / "snap.jsonl.gz"))
    assert len(groups) == 1 and groups[0][0] == CTX
    assert sorted(groups[0][1], key=str) == sorted(rows, key=str)
    with MeasurementStore(tmp_path / "b.sqlite") as b:
        assert b.import_snapshot(tmp_path / "snap.jsonl.gz") == len(rows)
        assert b.import_snapshot(tmp_path / "snap.jsonl.gz") == 0
    assert load_rows(tmp_path / "b.sqlite")[0][0] == CTX
    with pytest.raises(FileNotFoundError, match="collect one"):
        list(iter_snapshot(tmp_path / "missing.jsonl.gz"))


def _collect_cmd(db: Path) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "collect.py"), "--device", "cpu", "--kernels", "tiny_family:PADDED",
            "--model", "mixtral-8x7b", "--grid", "eval,default", "--configs-per-shape", "1000", "--db", str(db)]


def _env() -> dict[str, str]:
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "measure"), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_kill_9_mid_collection_then_resume(tmp_path: Path) -> None:
    """A real collection process is SIGKILLed once rows are being written; nothing committed is lost, no row is
    corrupt, and a second run completes exactly the rest of the plan."""
    from tiny_family import PADDED

    plan_size = sum(len(PADDED.space.valid_configs(w)) for g in ("eval", "default")
                    for w in PADDED.plan_workloads(None, g))
    db = tmp_path / "m.sqlite"
    proc = subprocess.Popen(_collect_cmd(db), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    seen_before_kill = 0
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if db.exists():
            try:
                con = sqlite3.connect(db, timeout=5)
                seen_before_kill = con.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
                con.close()
            except sqlite3.OperationalError:
                continue
            if seen_before_kill >= 64:
                break
    assert proc.poll() is None, f"collection ended before it could be killed: {proc.communicate()[1][-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    time.sleep(0.5)  # the shard and worker die with their parent (PR_SET_PDEATHSIG)
    with MeasurementStore(db) as store:
        after_kill = store.count()
        assert store.integrity_check() == "ok"
    assert seen_before_kill <= after_kill < plan_size, (seen_before_kill, after_kill, plan_size)
    time.sleep(0.5)
    with MeasurementStore(db) as store:
        assert store.count() == after_kill, "something kept writing after the kill"

    done = subprocess.run(_collect_cmd(db), env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"already stored {after_kill}" in done.stderr
    with MeasurementStore(db) as store:
        assert store.count() == plan_size
        assert store.count(status=OK) == plan_size
        assert store.integrity_check() == "ok"
        dup = store.conn.execute("SELECT COUNT(*) FROM (SELECT workload, config FROM measurements "
                                 "GROUP BY workload, config HAVING COUNT(*) > 1)").fetchone()[0]
        assert dup == 0


def test_put_many_replace_overwrites_in_place(tmp_path: Path) -> None:
    with MeasurementStore(tmp_path / "m.sqlite") as store:
        store.put_many(CTX, [_m("w1", "c1", 1.0), _m("w1", "c2", 2.0)])
        noisy = Measurement("fused_moe", "w1", "c1", OK, median_ms=3.0, spread=2.0, repeats=9)
        assert store.put_many(CTX, [noisy]) == 0  # a plain put keeps what is stored
        assert store.noisy_keys(CTX, 0.5) == []
        assert store.put_many(CTX, [noisy], replace=True) == 1
        assert store.count() == 2 and store.noisy_keys(CTX, 0.5) == [("w1", "c1")]
        rows = {r["config"]: r for r in store.rows("fused_moe")}
        assert rows["c1"]["median_ms"] == 3.0 and rows["c2"]["median_ms"] == 2.0


def test_remeasure_noisy_replaces_only_the_noisy_rows(tmp_path: Path) -> None:
    """`collect --remeasure-noisy` measures again exactly the stored ok rows whose spread is over the limit and
    overwrites them (here under the interpreter: correctness only, so the new rows carry no spread)."""
    db = tmp_path / "m.sqlite"
    first = subprocess.run(_collect_cmd(db), env=_env(), capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    with MeasurementStore(db) as store:
        n = store.count()
        ctx = next(iter_contexts(store))
        victims = sorted(store.done_keys(ctx))[:3]
        store.put_many(ctx, [Measurement(ctx.kernel, w, c, OK, median_ms=5.0, spread=3.0, repeats=9, source="live")
                             for w, c in victims], replace=True)
        assert sorted(store.noisy_keys(ctx, 0.5)) == victims
    again = subprocess.run([*_collect_cmd(db), "--remeasure-noisy"], env=_env(), capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "re-measuring 3 stored ok rows" in again.stderr
    assert "re-measured 3 of 3 rows; 0 are still too noisy" in again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["stopped_by_budget"] is False
    with MeasurementStore(db) as store:
        assert store.count() == n and store.noisy_keys(ctx, 0.5) == []
        sources = {(r["workload"], r["config"]): r["source"] for r in store.rows()}
        assert all(sources[k] == "interpreter" for k in victims)


def iter_contexts(store: MeasurementStore):
    for row in store.conn.execute("SELECT DISTINCT device, torch_version, triton_version, kernel, source_hash "
                                  "FROM measurements"):
        yield Context(*row)


def test_collect_plan_file_measures_exactly_its_pairs_and_rejects_bad_entries(tmp_path: Path) -> None:
    """`collect --plan FILE` measures the listed (workload, config) pairs, skips stored ones on a rerun, and refuses a
    plan whose config the knob space rejects (naming the entry) before measuring anything."""
    from tiny_family import TinyWorkload

    db = tmp_path / "m.sqlite"
    w1, w2 = TinyWorkload(100).key(), TinyWorkload(7).key()
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps([{"kernel": "tiny_family:FAMILY", "workload": w1, "configs": [{"BLOCK": 32}]},
                                {"kernel": "tiny_family:FAMILY", "workload": w2, "configs": ['{"BLOCK":16}']}]))
    cmd = [sys.executable, str(ROOT / "scripts" / "collect.py"), "--device", "cpu", "--kernels", "tiny_family:FAMILY",
           "--db", str(db), "--plan", str(plan)]
    run = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    with MeasurementStore(db) as store:
        assert sorted((r["workload"], r["config"]) for r in store.rows()) == sorted(
            [(w1, '{"BLOCK":32}'), (w2, '{"BLOCK":16}')])
    again = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "to measure 0" in again.stderr
    plan.write_text(json.dumps([{"kernel": "tiny_family:FAMILY", "workload": w2, "configs": [{"BLOCK": 256}]}]))
    bad = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "entry 0" in bad.stderr and "more than 4x" in bad.stderr
    with MeasurementStore(db) as store:
        assert store.count() == 2


def test_failed_re_measurement_keeps_the_stored_ok_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-measuring (replace=True) overwrites a noisy ok row with a new ok one, but a re-measurement that fails (here
    a crash) leaves the stored row as it was: nothing measured before is lost."""
    import kernel_gym.measure.live as live
    from kernel_gym.measure import collect

    w1, w2 = "w1", "w2"
    db = tmp_path / "m.sqlite"
    ctx = Context("NVIDIA H200", "2.11.0", "3.6.0", "tiny_scale", "h")
    with MeasurementStore(db) as store:
        store.put_many(ctx, [Measurement("tiny_scale", w, '{"BLOCK":32}', OK, median_ms=9.0, spread=3.0, repeats=9)
                             for w in (w1, w2)])

    class FakeBackend:  # answers w1 with a quiet time and w2 with a crash
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def prefetch(self, *args):
            return None

        def measure_many(self, fam, wl, configs):
            if wl == w1:
                return [Measurement("tiny_scale", w1, str(c), OK, median_ms=1.0, spread=0.01, repeats=3)
                        for c in configs]
            return [Measurement("tiny_scale", w2, str(c), "crash", reason="illegal address") for c in configs]

    monkeypatch.setattr(live, "LiveBackend", FakeBackend)
    monkeypatch.setattr(collect, "die_with_parent", lambda: None)
    monkeypatch.setattr(collect, "workload_from_key", lambda fam, key: key)
    items = [collect.PlanItem("tiny_family:FAMILY", w, ('{"BLOCK":32}',), "noisy") for w in (w1, w2)]
    written = collect.run_shard(items, str(db), {"tiny_family:FAMILY": ctx}, None, "cpu", 0, 0.0,
                                collect.DEFAULT_TIMING, replace=True)
    assert written == 1
    with MeasurementStore(db) as store:
        rows = {r["workload"]: r for r in store.rows()}
    assert rows[w1]["median_ms"] == 1.0 and rows[w1]["spread"] == 0.01
    assert rows[w2]["status"] == OK and rows[w2]["median_ms"] == 9.0 and rows[w2]["spread"] == 3.0


def test_plan_file_names_bad_entries_and_merges_repeats(tmp_path: Path) -> None:
    from tiny_family import TinyWorkload

    from kernel_gym.measure.collect import load_plan_file

    plan = tmp_path / "plan.json"
    w = TinyWorkload(100).key()
    plan.write_text(json.dumps([{"kernel": "tiny_family:FAMILY", "workload": w, "configs": [{"BLOCK": 32}]},
                                {"kernel": "tiny_family:FAMILY", "workload": w, "configs": [{"BLOCK": 64}]}]))
    (chunks,) = load_plan_file(str(plan), ["tiny_family:FAMILY"])
    assert [c.configs for c in chunks] == [('{"BLOCK":32}', '{"BLOCK":64}')]
    plan.write_text(json.dumps([{"kernel": "tiny_family:FAMILY", "workload": '{"kernel":"fused_moe","n":4}',
                                 "configs": [{"BLOCK": 32}]}]))
    with pytest.raises(SystemExit, match="entry 0.*fused_moe"):
        load_plan_file(str(plan), ["tiny_family:FAMILY"])
    plan.write_text(json.dumps([{"kernel": "tiny_family:FAMILY", "workload": w, "configs": {"BLOCK": 32}}]))
    with pytest.raises(SystemExit, match="entry 0 needs .*configs \\(a list\\)"):
        load_plan_file(str(plan), ["tiny_family:FAMILY"])


def test_legacy_source_hashes_read_as_their_version_and_move_there_when_a_store_is_opened(tmp_path):
    """Rows stored before versions carry a source hash: every reader maps the hashes a profile lists to its version
    key, opening the store for writing moves them there (nothing measured again), other hashes stay as they are."""
    import sqlite3

    from kernel_gym.kernels.profiles import profile
    from kernel_gym.measure.store import Context, MeasurementStore, iter_snapshot, load_rows
    from kernel_gym.measure.types import OK, Measurement

    def row(config: str) -> Measurement:
        return Measurement("fused_moe", "{}", config, OK, median_ms=1.0, spread=0.0, repeats=3, source="test")

    v1 = profile("fused_moe").store_key
    assert v1 == "v1" and "cccc58be1e48ac30" in profile("fused_moe").legacy_hashes
    db, snap = tmp_path / "s.sqlite", tmp_path / "s.jsonl.gz"
    with MeasurementStore(db) as store:
        store.put_many(Context("GPU", "t", "tr", "fused_moe", "cccc58be1e48ac30"), [row('{"a":1}'), row('{"a":2}')])
        store.put_many(Context("GPU", "t", "tr", "fused_moe", "someoldhash00000"), [row('{"a":3}')])
        store.conn.execute("UPDATE measurements SET source_hash='39fa995d3724b8c7' WHERE config='{\"a\":2}'")
    raw = {h for (h,) in sqlite3.connect(db).execute("SELECT DISTINCT source_hash FROM measurements")}
    assert raw == {"cccc58be1e48ac30", "39fa995d3724b8c7", "someoldhash00000"}  # written before the next open
    assert {c.source_hash: len(ms) for c, ms in load_rows(db)} == {v1: 2, "someoldhash00000": 1}
    with MeasurementStore(db) as store:
        assert store.done_keys(Context("GPU", "t", "tr", "fused_moe", v1)) == {("{}", '{"a":1}'), ("{}", '{"a":2}')}
        store.export_snapshot(snap)
    assert {c.source_hash: len(ms) for c, ms in iter_snapshot(snap)} == {v1: 2, "someoldhash00000": 1}


def test_a_shard_does_not_start_a_chunk_that_would_end_past_the_budget(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With chunks of 0.4 s and 1 s left, the shard runs two and stops before a third would overrun: a budgeted
    run (tune's 60 GPU-s) ends within its budget instead of finishing a chunk after it. The clock is a fake one
    that only the chunks advance, so a busy machine cannot change the outcome."""
    import types

    import kernel_gym.measure.live as live
    from kernel_gym.measure import collect

    clock = [100.0]
    time = types.SimpleNamespace(time=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(collect, "time", time)

    class SlowBackend:
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def prefetch(self, *args):
            return None

        def measure_many(self, fam, wl, configs):
            time.sleep(0.4)
            return [Measurement("tiny_scale", wl, str(c), OK, median_ms=1.0, spread=0.01, repeats=3) for c in configs]

    monkeypatch.setattr(live, "LiveBackend", SlowBackend)
    monkeypatch.setattr(collect, "die_with_parent", lambda: None)
    monkeypatch.setattr(collect, "workload_from_key", lambda fam, key: key)
    ctx = Context("NVIDIA H200", "2.11.0", "3.6.0", "tiny_scale", "h")
    items = [collect.PlanItem("tiny_family:FAMILY", f"w{i}", ('{"BLOCK":32}',), "new") for i in range(6)]
    t0 = time.time()
    written = collect.run_shard(items, str(tmp_path / "m.sqlite"), {"tiny_family:FAMILY": ctx}, None, "cpu", 0,
                                t0 + 1.0, collect.DEFAULT_TIMING)
    assert written == 2 and time.time() - t0 < 1.0  # fake seconds: the chunks' 0.8, not the machine's
