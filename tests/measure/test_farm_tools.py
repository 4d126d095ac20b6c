"""What the farm adds that needs no Ray: host and GPU columns (older stores still open, the snapshot unchanged), the
work queue's order, merging stores, comparing two stores and comparing GPUs, and `collect --ray` without Ray."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
from pathlib import Path

import pytest

from kernel_gym.measure.collect import PlanItem
from kernel_gym.measure.store import PACKAGED_SNAPSHOT, Context, MeasurementStore, iter_snapshot
from kernel_gym.measure.storetools import (
    compare_gpus,
    compare_stores,
    format_gpu_report,
    merge_stores,
    put_replicas,
    replica_rows,
)
from kernel_gym.measure.types import CRASH, OK, Measurement

CTX = Context("NVIDIA H200", "2.11.0", "3.6.0", "fused_moe", "abc123")
OLD_SCHEMA = """
CREATE TABLE measurements (
    id INTEGER PRIMARY KEY, device TEXT NOT NULL, torch_version TEXT NOT NULL, triton_version TEXT NOT NULL,
    kernel TEXT NOT NULL, source_hash TEXT NOT NULL, workload TEXT NOT NULL, config TEXT NOT NULL,
    status TEXT NOT NULL, median_ms REAL, spread REAL, repeats INTEGER NOT NULL DEFAULT 0, compile_s REAL,
    reason TEXT NOT NULL DEFAULT '', source TEXT NOT NULL, created REAL NOT NULL,
    UNIQUE (device, torch_version, triton_version, kernel, source_hash, workload, config)
);
"""


def _m(w: str, c: str, t: float | None = 1.0, status: str = OK, spread: float = 0.01) -> Measurement:
    return Measurement("fused_moe", w, c, status, median_ms=t if status == OK else None, spread=spread, repeats=3,
                       reason="" if status == OK else "boom")


def _store(path: Path, rows: list[Measurement], origin: tuple[str, str] | None = None) -> Path:
    with MeasurementStore(path) as s:
        s.put_many(CTX, rows, origin=origin)
    return path


def test_an_older_store_gains_the_origin_columns_and_the_snapshot_is_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite"
    con = sqlite3.connect(db)
    con.executescript(OLD_SCHEMA)
    con.execute("INSERT INTO measurements (device, torch_version, triton_version, kernel, source_hash, workload, "
                "config, status, median_ms, source, created) VALUES ('NVIDIA H200', '2.11.0', '3.6.0', 'fused_moe', "
                "'abc123', 'w0', 'c0', 'ok', 1.0, 'live', 0)")
    con.commit()
    con.close()
    with MeasurementStore(db) as s:
        assert [(r["host"], r["gpu"]) for r in s.rows(origin=True)] == [("", "")]
        assert "host" not in next(s.rows())  # rows() keeps its columns
        assert s.put_many(CTX, [_m("w1", "c1")], origin=("hostA", "3")) == 1
        assert s.done_keys(CTX) == {("w0", "c0"), ("w1", "c1")}
        assert s.export_snapshot(tmp_path / "snap.jsonl.gz") == 2
    with MeasurementStore(db) as s:  # opening again adds nothing twice
        assert {(r["config"], r["host"], r["gpu"]) for r in s.rows(origin=True)} == {("c0", "", ""), ("c1", "hostA",
                                                                                                        "3")}
    (ctx, rows), = iter_snapshot(tmp_path / "snap.jsonl.gz")
    assert ctx == CTX and {m.config for m in rows} == {"c0", "c1"}


def test_the_packaged_dataset_still_loads() -> None:
    ctx, rows = next(iter_snapshot(PACKAGED_SNAPSHOT))
    assert ctx.device and rows and rows[0].workload


def test_replace_also_updates_the_origin(tmp_path: Path) -> None:
    with MeasurementStore(tmp_path / "s.sqlite") as s:
        s.put_many(CTX, [_m("w", "c", 2.0, spread=3.0)], origin=("a", "0"))
        s.put_many(CTX, [_m("w", "c", 1.0)], origin=("b", "1"), replace=True)
        (row,) = s.rows(origin=True)
    assert (row["median_ms"], row["host"], row["gpu"]) == (1.0, "b", "1")


def test_work_queue_longest_first_keeps_a_workloads_chunks_together() -> None:
    from kernel_gym.kernels.workloads import model_workloads
    from kernel_gym.measure.farm import WorkQueue, order_plan
    from kernel_gym.measure.timing import DEFAULT_TIMING
    from kernel_gym.models import load_model

    wls = sorted(model_workloads("fused_moe", load_model("mixtral-8x7b"), "eval"), key=lambda w: w.num_tokens)
    lo, hi = wls[0].key(), wls[-1].key()
    small = [PlanItem("fused_moe", lo, ("a", "b"), "eval")]
    big = [PlanItem("fused_moe", hi, ("a",), "eval"), PlanItem("fused_moe", hi, ("b",), "eval")]
    assert order_plan([small, big], DEFAULT_TIMING, longest_first=True) == big + small
    assert order_plan([small, big], DEFAULT_TIMING, longest_first=False) == small + big
    q = WorkQueue(order_plan([small, big], DEFAULT_TIMING, longest_first=True))
    assert len(q) == 3
    first = q.take()
    assert first == big[0]
    assert q.take(prefer=("fused_moe", lo)) == small[0]  # the preferred workload first (an actor's last one)
    q.put_back(small[0])
    assert q.take() == small[0]  # put back at the front
    assert q.take() == big[1] and q.take() is None and len(q) == 0


# merged rows must be readable rows: JSON workloads and configs (merge refuses others, issue 25)
J = {n: '{"%s":%s}' % (n[0], n[1:]) for n in ("w1", "w2", "c1", "c2")}


def _j(w: str, c: str, *a, **kw) -> Measurement:
    return _m(J[w], J[c], *a, **kw)


def test_merge_deduplicates_and_keeps_other_gpus_timings_as_replicas(tmp_path: Path) -> None:
    a = _store(tmp_path / "a.sqlite", [_j("w1", "c1", 1.0), _j("w1", "c2", 2.0)], ("hostA", "0"))
    b = _store(tmp_path / "b.sqlite", [_j("w1", "c1", 1.1), _j("w2", "c1", 3.0, CRASH)], ("hostB", "1"))
    snap = tmp_path / "a.jsonl.gz"
    with MeasurementStore(a) as s:
        s.export_snapshot(snap)
    into = tmp_path / "c.sqlite"
    rep = merge_stores([a, b, snap], into)
    assert rep["sources"][str(a)] == {"rows": 2, "inserted": 2, "duplicates": 0, "replicas": 0}
    assert rep["sources"][str(b)] == {"rows": 2, "inserted": 1, "duplicates": 1, "replicas": 1}
    assert rep["sources"][str(snap)]["inserted"] == 0 and rep["rows"] == 3 and rep["integrity"] == "ok"
    with MeasurementStore(into) as s:
        rows = {(r["workload"], r["config"]): r for r in s.rows(origin=True)}
        reps = list(replica_rows(s.conn))
    first = rows[(J["w1"], J["c1"])]
    assert first["host"] == "hostA" and first["median_ms"] == 1.0  # the first kept
    assert rows[(J["w2"], J["c1"])]["status"] == CRASH
    b_replicas = [r for r in reps if r["host"] == "hostB"]
    assert [(r["config"], r["median_ms"], r["run"]) for r in b_replicas] == [(J["c1"], 1.1, "merge:b.sqlite")]
    again = merge_stores([a, b], into)  # idempotent
    assert all(c["inserted"] == 0 and c["replicas"] == 0 for c in again["sources"].values()) and again["rows"] == 3
    with pytest.raises(ValueError, match="also the target"):
        merge_stores([a], a)
    # the GPU comparison finds the two GPUs' timings of w1/c1
    rep = compare_gpus([into])
    assert rep["keys_on_several_gpus"] == 1
    (pair,) = rep["pairs"].values()
    assert pair["median"] == pytest.approx(1.1)


def test_data_merge_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from kernel_gym.cli import main

    a = _store(tmp_path / "a.sqlite", [_j("w1", "c1")], ("h", "0"))
    b = _store(tmp_path / "b.sqlite", [_j("w1", "c1", 1.2), _j("w2", "c1")], ("h", "1"))
    assert main(["data", "--merge", str(a), str(b), "--into", str(tmp_path / "c.db")]) == 0
    out = capsys.readouterr().out
    assert "1 new, 1 already there (1 kept as replicas)" in out and "c.db: 2 rows, integrity ok" in out
    assert main(["data", "--merge", str(a)]) == 2
    assert "needs --into" in capsys.readouterr().err


def test_compare_stores_rows_statuses_and_noise(tmp_path: Path) -> None:
    from tests.script_module import load_script

    base = [_m(f"w{i}", f"c{j}", 0.1 * (i + j + 1)) for i in range(4) for j in range(5)] + [
        _m("w9", "c0", None, CRASH)]
    a = _store(tmp_path / "a.sqlite", base)
    same = _store(tmp_path / "same.sqlite", [m if m.status != OK else
                                             Measurement(**{**m.to_dict(), "median_ms": m.median_ms * 1.01})
                                             for m in base])
    res = compare_stores(a, same)
    assert res["ok"] and res["common"] == 21 and res["timings"]["pairs"] == 20
    assert res["timings"]["geomean_ratio"] == pytest.approx(1.01)
    slow = _store(tmp_path / "slow.sqlite", [m if m.status != OK else
                                             Measurement(**{**m.to_dict(), "median_ms": m.median_ms * 1.2})
                                             for m in base])
    res = compare_stores(a, slow)
    assert res["same_rows"] and res["same_status"] and not res["timings_within_noise"] and not res["ok"]
    other = _store(tmp_path / "other.sqlite", base[1:-1] + [_m("w9", "c0", 1.0)])
    res = compare_stores(a, other)
    assert (res["only_a"], res["only_b"], res["status_mismatch_kinds"]) == (1, 0, {"crash->ok": 1})
    script = load_script("compare_stores")
    assert script.main([str(a), str(same), "--json", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["ok"] is True
    assert script.main([str(a), str(slow)]) == 1


def test_gpu_comparison_offsets_and_winner_changes(tmp_path: Path) -> None:
    """Two GPUs time the same 3 configs on 2 workloads; GPU 1 is 10% slower on everything except one config that
    makes it pick another winner on workload w1."""
    db = tmp_path / "g.sqlite"
    t = {("w0", "c0"): 1.0, ("w0", "c1"): 2.0, ("w0", "c2"): 3.0, ("w1", "c0"): 1.0, ("w1", "c1"): 1.05,
         ("w1", "c2"): 4.0}
    with MeasurementStore(db) as s:
        put_replicas(s, CTX, [_m(w, c, v) for (w, c), v in t.items()], ("h", "0"), "noise:1:0")
        g1 = {k: v * 1.1 for k, v in t.items()}
        g1[("w1", "c1")] = 0.9
        put_replicas(s, CTX, [_m(w, c, v) for (w, c), v in g1.items()], ("h", "1"), "noise:1:0")
        put_replicas(s, CTX, [_m("w0", "c0", None, CRASH)], ("h", "1"), "noise:1:1")  # failures are left out
    rep = compare_gpus([db])
    assert rep["gpus"] == ["NVIDIA H200@h:0", "NVIDIA H200@h:1"] and rep["keys_on_several_gpus"] == 6
    assert rep["pairs"]["NVIDIA H200@h:1 / NVIDIA H200@h:0"]["median"] == pytest.approx(1.1)
    assert rep["winner_pairs"] == 2 and rep["winner_change_rate"] == 0.5
    assert "fastest config differs between two GPUs in 50.0%" in format_gpu_report(rep)


def test_collect_ray_without_ray_exits_2_with_the_install_line(monkeypatch, capsys, tmp_path: Path) -> None:
    from kernel_gym.cli import collect

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert collect.main(["--ray", "--device", "cpu", "--db", str(tmp_path / "x.sqlite")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'kernel_gym[ray]'" in err[0]
    assert not (tmp_path / "x.sqlite").exists()
    assert collect.main(["--dry-run", "--kernels", "tiny_family:FAMILY", "--model", "mixtral-8x7b"]) == 0  # no --ray


def test_a_chunk_that_keeps_killing_actors_is_bisected_to_its_culprit(tmp_path: Path) -> None:
    """Farm._failed: after MAX_ATTEMPTS failures a chunk is split in halves (queued again), never written off whole;
    only a single config that keeps failing is stored as crash."""
    pytest.importorskip("ray")
    from types import SimpleNamespace

    from kernel_gym.measure import farm as fm

    queue = fm.WorkQueue([])
    ctx = Context.current("tiny", "h", device="cpu-interpreter")
    driver = SimpleNamespace(actor_failures=0, attempts={}, log=sys.stderr, requeued=0, written=0,
                             _why=lambda exc: str(exc), _give_back=lambda slot: None, _queue=lambda slot: queue,
                             contexts_of={"g": {"tiny": ctx}}, group_of={}, opts=SimpleNamespace(device="cpu",
                             remeasure_noisy=False), farm=SimpleNamespace(max_actor_restarts=100))
    slot = fm.Slot(actor=None, node="n", info={"pid": 1})
    driver.group_of[id(slot)] = "g"
    configs = tuple(json.dumps({"B": i}) for i in range(4))
    item = PlanItem("tiny", '{"n":1}', configs, "eval")
    with MeasurementStore(tmp_path / "s.sqlite") as store:
        for _ in range(fm.MAX_ATTEMPTS):
            fm.Farm._failed(driver, slot, item, RuntimeError("actor died"), store)
        halves = {queue.take().configs for _ in range(2)}
        assert halves == {configs[:2], configs[2:]} and store.count() == 0
        single = PlanItem("tiny", '{"n":1}', configs[:1], "eval")
        for _ in range(fm.MAX_ATTEMPTS):
            fm.Farm._failed(driver, slot, single, RuntimeError("actor died"), store)
        rows = list(store.rows())
    assert [(r["config"], r["status"]) for r in rows] == [(configs[0], CRASH)]


def test_merge_keeps_each_rows_power_state(tmp_path: Path) -> None:
    """The GPU's clock and power state recorded with a row (measure/power.py) survives `data --merge`."""
    power = '{"src":"nvml","sm":[1980.0],"w":[400.0]}'
    m = dataclasses.replace(_j("w1", "c1", 1.0), power=power)
    a = _store(tmp_path / "a.sqlite", [m, _j("w2", "c1", 2.0)], ("hostA", "0"))
    into = tmp_path / "c.sqlite"
    merge_stores([a], into)
    with MeasurementStore(into) as s:
        got = {r["workload"]: r["power"] for r in s.rows(origin=True)}
    assert got == {J["w1"]: power, J["w2"]: ""}


def test_merge_prefer_steadier_replaces_a_noisier_ok_row_and_keeps_it_as_a_replica(tmp_path: Path) -> None:
    """A re-timing of a noisy row (data --merge --prefer-steadier) takes its place; a noisier or failed re-timing
    does not, and without the flag the stored row stays (the re-timing goes to replicas)."""
    old_rows = [_m(J["w1"], J["c1"], 3.0, spread=0.4), _m(J["w1"], J["c2"], 1.0), _m(J["w2"], J["c1"], 2.0, spread=0.3)]
    new_rows = [_m(J["w1"], J["c1"], 1.9, spread=0.01), _m(J["w1"], J["c2"], 0.5, spread=0.2),
                _m(J["w2"], J["c1"], None, CRASH)]
    old = _store(tmp_path / "old.sqlite", old_rows, ("hA", "0"))
    new = _store(tmp_path / "new.sqlite", new_rows, ("hB", "0"))
    plain = tmp_path / "plain.sqlite"
    merge_stores([old], plain)
    merge_stores([new], plain)
    with MeasurementStore(plain) as s:
        assert {r["median_ms"] for r in s.rows() if r["workload"] == J["w1"] and r["config"] == J["c1"]} == {3.0}
    into = tmp_path / "into.sqlite"
    merge_stores([old], into)
    rep = merge_stores([new], into, prefer_steadier=True)
    assert rep["sources"][str(new)]["replaced"] == 1
    with MeasurementStore(into) as s:
        rows = {(r["workload"], r["config"]): r for r in s.rows(origin=True)}
        reps = list(replica_rows(s.conn))
    assert rows[(J["w1"], J["c1"])]["median_ms"] == 1.9 and rows[(J["w1"], J["c1"])]["host"] == "hB"
    assert rows[(J["w1"], J["c2"])]["median_ms"] == 1.0  # the re-timing spread more: the stored row stays
    assert rows[(J["w2"], J["c1"])]["status"] == OK  # a failed re-timing never replaces an ok row
    superseded = [r for r in reps if r["run"] == "superseded"]
    assert [(r["config"], r["median_ms"], r["host"]) for r in superseded] == [(J["c1"], 3.0, "hA")]
