"""Tools over whole measurement stores: merge stores from separate runs, compare two stores (a plain collection and a
farm run of the same plan), and compare GPUs (the same config timed on several GPUs).

- `merge_stores(sources, into)`: every row of each source (a SQLite store or a .jsonl.gz snapshot) into `into`,
  deduplicated by the store's unique key (device, torch, triton, kernel, source hash, workload, config); the row
  already in `into` is kept. A duplicate measured elsewhere (another host or GPU, or another time) is not thrown away:
  it goes to the `replicas` table, where `gpu_comparison` finds it. Sources are opened read-only.
- `compare_stores(a, b)`: the same keys and statuses, and ok timings within noise (scripts/compare_stores.py).
- `replicas`: repeated measurements of stored keys, one row per (key, host, gpu, run). The farm's cross-GPU noise
  study (`collect --ray --noise N`) writes each GPU's repeats here; merges write duplicates here.
- `gpu_comparison(rows)` / `compare_gpus(dbs)`: per (kernel, source hash, workload, config) measured on two or more
  GPUs, each GPU's median; reported: spread across GPUs (CV), per-GPU offset from the key's cross-GPU median, per GPU
  pair the ratio of medians, and how often the fastest config of a workload differs between two GPUs.

Imports only the standard library: this module runs on the GPU machine too.
"""

from __future__ import annotations

import math
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from itertools import combinations
from pathlib import Path
from typing import Any

from kernel_gym.measure.store import (
    COLUMNS,
    CONTEXT_FIELDS,
    ORIGIN_COLUMNS,
    POWER_COLUMN,
    ROW_FIELDS,
    Context,
    MeasurementStore,
    check_row,
    connect_read_only,
    write_error,
)
from kernel_gym.measure.types import OK, Measurement

KEY_FIELDS = ("device", "torch_version", "triton_version", "kernel", "source_hash", "workload", "config")
REPLICA_FIELDS = KEY_FIELDS + ("host", "gpu", "run", "status", "median_ms", "spread", "repeats", "reason", "source",
                               "created")
REPLICA_SCHEMA = """
CREATE TABLE IF NOT EXISTS replicas (
    id INTEGER PRIMARY KEY,
    device TEXT NOT NULL, torch_version TEXT NOT NULL, triton_version TEXT NOT NULL, kernel TEXT NOT NULL,
    source_hash TEXT NOT NULL, workload TEXT NOT NULL, config TEXT NOT NULL,
    host TEXT NOT NULL, gpu TEXT NOT NULL, run TEXT NOT NULL,
    status TEXT NOT NULL, median_ms REAL, spread REAL, repeats INTEGER NOT NULL DEFAULT 0,
    reason TEXT NOT NULL DEFAULT '', source TEXT NOT NULL DEFAULT '', created REAL NOT NULL,
    UNIQUE (device, torch_version, triton_version, kernel, source_hash, workload, config, host, gpu, run)
);
CREATE INDEX IF NOT EXISTS replicas_key ON replicas (kernel, workload, config);
"""
_REPLICA_INSERT = (f"INSERT INTO replicas ({','.join(REPLICA_FIELDS)}) VALUES ({','.join('?' * len(REPLICA_FIELDS))}) "
                   "ON CONFLICT DO NOTHING")


# ---- replicas ---------------------------------------------------------------------------------------------------


def ensure_replicas(store: MeasurementStore) -> None:
    store.conn.executescript(REPLICA_SCHEMA)


def put_replicas(store: MeasurementStore, context: Context, measurements: Iterable[Measurement],
                 origin: tuple[str, str], run: str) -> int:
    """Repeated measurements of one context, measured on origin = (host, gpu), labelled `run`, in one transaction."""
    ensure_replicas(store)
    now = time.time()
    rows = [(*[getattr(context, f) for f in CONTEXT_FIELDS], m.workload, m.config, *origin, run, m.status,
             m.median_ms if m.status == OK else None, m.spread, m.repeats, m.reason, m.source, now)
            for m in measurements]
    return _insert_replicas(store.conn, rows)


def _insert_replicas(conn: sqlite3.Connection, rows: list[tuple]) -> int:
    if not rows:
        return 0
    before = conn.total_changes
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(_REPLICA_INSERT, rows)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return conn.total_changes - before


def replica_rows(conn: sqlite3.Connection) -> Iterator[dict[str, Any]]:
    if not conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='replicas'").fetchone():
        return
    for row in conn.execute(f"SELECT {','.join(REPLICA_FIELDS)} FROM replicas ORDER BY id"):
        yield dict(zip(REPLICA_FIELDS, row))


# ---- reading a source read-only -----------------------------------------------------------------------------------


def _open_ro(path: Path) -> sqlite3.Connection:
    if not path.is_file():
        raise FileNotFoundError(f"no measurement store at {path}" + (" (a folder): pass the .sqlite file in it"
                                                                     if path.is_dir() else
                                                                     ": pass the .sqlite file collect / tune wrote "
                                                                     "(their --db)"))
    try:  # a WAL store in a read-only folder is read as it is, unless its -wal holds rows (connect_read_only)
        conn = connect_read_only(path)
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{path} is not a SQLite measurement store ({exc}): pass a store written by kernel-gym "
                         "collect or a .jsonl.gz snapshot") from None
    try:
        have = {r[1] for r in conn.execute("PRAGMA table_info(measurements)")}
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise ValueError(f"{path} is not a SQLite measurement store ({exc})") from None
    if not set(COLUMNS) <= have:
        conn.close()
        raise ValueError(f"{path} is not a kernel_gym measurement store (no measurements table with its columns): "
                         "pass a store written by kernel-gym collect")
    return conn


def _main_rows(conn: sqlite3.Connection) -> Iterator[dict[str, Any]]:
    have = {r[1] for r in conn.execute("PRAGMA table_info(measurements)")}
    cols = ["id"] + [c for c in (*COLUMNS, *ORIGIN_COLUMNS, POWER_COLUMN) if c in have]
    for row in conn.execute(f"SELECT {','.join(cols)} FROM measurements ORDER BY id"):
        d = dict(zip(cols, row))
        for c in (*ORIGIN_COLUMNS, POWER_COLUMN):
            d.setdefault(c, "")
        yield d


class _Source:
    """A store or a snapshot, opened read-only (a snapshot through a temporary store)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._tmp: tempfile.TemporaryDirectory | None = None
        if self.path.suffix == ".gz":
            self._tmp = tempfile.TemporaryDirectory()
            db = Path(self._tmp.name) / "snapshot.sqlite"
            with MeasurementStore(db) as s:
                s.import_snapshot(self.path)
            self.conn = _open_ro(db)
        else:
            self.conn = _open_ro(self.path)

    def rows(self) -> Iterator[dict[str, Any]]:
        return _main_rows(self.conn)

    def replicas(self) -> Iterator[dict[str, Any]]:
        return replica_rows(self.conn)

    # Same shape as LiveBackend's close / __enter__ / __exit__ (duplicate scan): the context-manager idiom, on purpose.
    def close(self) -> None:
        self.conn.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> _Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- merge ---------------------------------------------------------------------------------------------------------


# the stored row's replica fields (its run named "superseded") when a steadier re-timing takes its place
_SUPERSEDED = ("SELECT " + ",".join("'superseded'" if f == "run" else f for f in REPLICA_FIELDS[len(KEY_FIELDS):])
               + " FROM measurements WHERE ")


def _merge_batch(conn: sqlite3.Connection, rows: list[dict[str, Any]], run: str, counts: dict[str, int],
                 prefer_steadier: bool = False) -> None:
    """Insert rows in one transaction; a row whose key is stored already goes to replicas unless it is the same
    measurement (same status, median, spread and samples: the same store merged twice, or a snapshot of it).
    prefer_steadier: an ok row whose stored ok row spread more takes its place (a re-timing of a noisy row), and the
    stored measurement goes to replicas instead (counted as `replaced`)."""
    cols = (*COLUMNS, *ORIGIN_COLUMNS, POWER_COLUMN)  # the GPU's power state travels with its row
    insert = (f"INSERT INTO measurements ({','.join(cols)}) VALUES ({','.join('?' * len(cols))}) "
              "ON CONFLICT DO NOTHING")
    existing = ("SELECT status, median_ms, spread, repeats FROM measurements WHERE "
                + " AND ".join(f"{k}=?" for k in KEY_FIELDS))
    conn.execute("BEGIN IMMEDIATE")
    try:
        replicas = []
        for r in rows:
            if conn.execute(insert, [r[c] for c in cols]).rowcount == 1:
                counts["inserted"] += 1
                continue
            counts["duplicates"] += 1
            stored = conn.execute(existing, [r[k] for k in KEY_FIELDS]).fetchone()
            if (prefer_steadier and stored is not None and stored[0] == r["status"] == OK
                    and r["spread"] is not None and stored[2] is not None and r["spread"] < stored[2]):
                old = conn.execute(_SUPERSEDED + " AND ".join(f"{k}=?" for k in KEY_FIELDS),
                                   [r[k] for k in KEY_FIELDS]).fetchone()
                replicas.append((*[r[k] for k in KEY_FIELDS], *old))
                keep = [c for c in cols if c not in KEY_FIELDS]
                conn.execute(f"UPDATE measurements SET {','.join(f'{c}=?' for c in keep)} WHERE "
                             + " AND ".join(f"{k}=?" for k in KEY_FIELDS),
                             [r[c] for c in keep] + [r[k] for k in KEY_FIELDS])
                counts["replaced"] = counts.get("replaced", 0) + 1
                continue
            if stored != (r["status"], r["median_ms"], r["spread"], r["repeats"]):
                replicas.append((*[r[k] for k in KEY_FIELDS], r["host"], r["gpu"], run, r["status"], r["median_ms"],
                                 r["spread"], r["repeats"], r["reason"], r["source"], r["created"]))
        before = conn.total_changes
        conn.executemany(_REPLICA_INSERT, replicas)
        counts["replicas"] += conn.total_changes - before
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def merge_stores(sources: list[str | Path], into: str | Path, batch: int = 5000,
                 prefer_steadier: bool = False) -> dict[str, Any]:
    """Merge sources into `into` (created when missing), deduplicating by the store's key; per source: rows read,
    rows inserted, duplicates, and how many duplicates were kept as replicas (measured elsewhere or at another time).
    prefer_steadier: a source's ok row replaces a stored ok row that spread more (see _merge_batch).
    A kill leaves every committed batch; a rerun inserts nothing twice."""
    report: dict[str, Any] = {"into": str(into), "sources": {}}
    if Path(into).name.endswith(".gz"):  # a SQLite file named .gz would be read back as a corrupt snapshot
        raise ValueError(f"merge: --into {into} names a .jsonl.gz snapshot, but merge writes a SQLite store: pass "
                         "--into NEW.sqlite (kernel-gym data --db NEW.sqlite reads it)")
    for src_path in sources:
        if Path(src_path).resolve() == Path(into).resolve():
            raise ValueError(f"merge: {src_path} is also the target (--into); give a new file")
    if Path(into).exists():  # never write kernel_gym tables into someone else's database (an MLflow store, ...)
        MeasurementStore(into, read_only=True).close()
    for src_path in sources:  # every row checked as `data` reads it, before anything is written
        with _Source(src_path) as src:
            for r in src.rows():
                check_row(src_path, f"row id {r['id']}",
                          Measurement(kernel=r["kernel"], **{f: r[f] for f in ROW_FIELDS}), strict=True)
    dest = MeasurementStore(into)
    try:
        ensure_replicas(dest)
        for src_path in sources:
            counts = {"rows": 0, "inserted": 0, "duplicates": 0, "replicas": 0}
            run = f"merge:{Path(src_path).name}"
            with _Source(src_path) as src:
                pending: list[dict[str, Any]] = []
                for r in src.rows():
                    counts["rows"] += 1
                    pending.append(r)
                    if len(pending) >= batch:
                        _merge_batch(dest.conn, pending, run, counts, prefer_steadier)
                        pending = []
                if pending:
                    _merge_batch(dest.conn, pending, run, counts, prefer_steadier)
                copied = [tuple(r[f] for f in REPLICA_FIELDS) for r in src.replicas()]
                counts["replicas"] += _insert_replicas(dest.conn, copied)
            report["sources"][str(src_path)] = counts
        report["rows"] = dest.count()
        report["integrity"] = dest.integrity_check()
    except sqlite3.OperationalError as exc:  # a read-only target, a lock held past the timeout: every batch committed
        raise write_error(Path(into), exc) from None  # so far stays, and a rerun inserts nothing twice
    finally:
        dest.close()
    return report


# ---- compare two stores ---------------------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    if not v:
        return float("nan")
    pos = q * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def _keyed(path: str | Path) -> tuple[dict[tuple[str, str, str, str], dict[str, Any]], dict[str, list[str]]]:
    """{(kernel, source_hash, workload, config): row} of a store, and the contexts it holds (devices, versions)."""
    out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    seen: dict[str, set[str]] = {"device": set(), "torch_version": set(), "triton_version": set(), "host": set()}
    with _Source(path) as src:
        for r in src.rows():
            out[(r["kernel"], r["source_hash"], r["workload"], r["config"])] = r
            for k in seen:
                seen[k].add(r[k])
    return out, {k: sorted(v) for k, v in seen.items()}


def compare_stores(a: str | Path, b: str | Path, rel_tol: float = 0.05, spread_k: float = 1.0,
                   geo_tol: float = 0.03, min_within: float = 0.9, examples: int = 5) -> dict[str, Any]:
    """Are two stores the same measurements? Keys (kernel, source hash, workload, config; the device is reported, not
    matched, so stores of two machines compare), statuses, and for rows ok in both the ratio of medians b / a.
    A pair is within noise when |b/a - 1| <= max(rel_tol, spread_k * the larger of the two rows' spreads). Verdict:
    `same_rows`, `same_status`, `timings_within_noise` (geomean ratio within 1 +- geo_tol and at least min_within of
    the pairs within noise; true when neither store has timings, as under the interpreter) and `ok` (all three)."""
    ra, ctx_a = _keyed(a)
    rb, ctx_b = _keyed(b)
    common = ra.keys() & rb.keys()
    only_a, only_b = sorted(ra.keys() - rb.keys()), sorted(rb.keys() - ra.keys())
    mismatch: dict[str, int] = {}
    mismatch_examples = []
    ratios, within = [], 0
    worst: list[tuple[float, tuple]] = []
    for k in sorted(common):
        sa, sb = ra[k]["status"], rb[k]["status"]
        if sa != sb:
            mismatch[f"{sa}->{sb}"] = mismatch.get(f"{sa}->{sb}", 0) + 1
            if len(mismatch_examples) < examples:
                mismatch_examples.append({"key": list(k), "a": [sa, ra[k]["reason"]], "b": [sb, rb[k]["reason"]]})
            continue
        ta, tb = ra[k]["median_ms"], rb[k]["median_ms"]
        if sa == OK and ta and tb:
            ratio = tb / ta
            ratios.append(ratio)
            noise = max(rel_tol, spread_k * max(ra[k]["spread"] or 0.0, rb[k]["spread"] or 0.0))
            within += abs(ratio - 1) <= noise
            worst.append((abs(math.log(ratio)), k))
    worst.sort(reverse=True)
    timings: dict[str, Any] = {"pairs": len(ratios)}
    if ratios:
        timings.update(
            geomean_ratio=math.exp(statistics.fmean(math.log(r) for r in ratios)),
            ratio_p10=_quantile(ratios, 0.1), ratio_p50=_quantile(ratios, 0.5), ratio_p90=_quantile(ratios, 0.9),
            within_noise=within / len(ratios),
            worst=[{"key": list(k), "ratio": rb[k]["median_ms"] / ra[k]["median_ms"], "a_ms": ra[k]["median_ms"],
                    "b_ms": rb[k]["median_ms"], "spread_a": ra[k]["spread"], "spread_b": rb[k]["spread"]}
                   for _, k in worst[:examples]])
    timings_ok = not ratios or (abs(timings["geomean_ratio"] - 1) <= geo_tol and timings["within_noise"] >= min_within)
    out = {
        "a": {"path": str(a), "rows": len(ra), **ctx_a},
        "b": {"path": str(b), "rows": len(rb), **ctx_b},
        "common": len(common),
        "only_a": len(only_a), "only_b": len(only_b),
        "only_a_examples": [list(k) for k in only_a[:examples]],
        "only_b_examples": [list(k) for k in only_b[:examples]],
        "status_mismatches": sum(mismatch.values()), "status_mismatch_kinds": mismatch,
        "status_mismatch_examples": mismatch_examples,
        "timings": timings,
        "tolerances": {"rel_tol": rel_tol, "spread_k": spread_k, "geo_tol": geo_tol, "min_within": min_within},
        "same_rows": not only_a and not only_b,
        "same_status": not mismatch,
        "timings_within_noise": timings_ok,
    }
    out["ok"] = out["same_rows"] and out["same_status"] and out["timings_within_noise"]
    return out


def format_comparison(c: dict[str, Any]) -> str:
    t = c["timings"]
    lines = [f"A {c['a']['path']}: {c['a']['rows']} rows on {', '.join(c['a']['device'])} "
             f"(hosts {', '.join(h or '?' for h in c['a']['host'])})",
             f"B {c['b']['path']}: {c['b']['rows']} rows on {', '.join(c['b']['device'])} "
             f"(hosts {', '.join(h or '?' for h in c['b']['host'])})",
             f"common keys {c['common']}; only in A {c['only_a']}; only in B {c['only_b']}; "
             f"status mismatches {c['status_mismatches']} {c['status_mismatch_kinds'] or ''}"]
    if t["pairs"]:
        lines.append(f"ok in both: {t['pairs']} pairs; B/A geomean {t['geomean_ratio']:.4f}, p10 / p50 / p90 "
                     f"{t['ratio_p10']:.3f} / {t['ratio_p50']:.3f} / {t['ratio_p90']:.3f}; within noise "
                     f"{100 * t['within_noise']:.1f}%")
    else:
        lines.append("no timed pairs (interpreter stores, or nothing in common)")
    lines.append(f"same rows {c['same_rows']}, same statuses {c['same_status']}, timings within noise "
                 f"{c['timings_within_noise']}: {'OK' if c['ok'] else 'DIFFERENT'}")
    return "\n".join(lines)


# ---- compare GPUs ---------------------------------------------------------------------------------------------------


def gpu_rows(paths: list[str | Path]) -> list[dict[str, Any]]:
    """Every row of the stores' main tables and replicas (snapshots: main rows only, without an origin)."""
    rows: list[dict[str, Any]] = []
    for p in paths:
        with _Source(p) as src:
            rows.extend(src.rows())
            rows.extend(src.replicas())
    return rows


def gpu_comparison(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Compare GPUs on identical (kernel, source hash, workload, config) rows. A GPU is (device, host, gpu); its time
    for a key is the median of its ok rows for that key. Keys timed on two or more GPUs are compared."""
    per: dict[tuple[str, str, str, str], dict[str, list[float]]] = {}
    for r in rows:
        if r["status"] != OK or not r["median_ms"]:
            continue
        label = f"{r['device']}@{r['host'] or '?'}:{r['gpu'] if r['gpu'] != '' else '?'}"
        key = (r["kernel"], r["source_hash"], r["workload"], r["config"])
        per.setdefault(key, {}).setdefault(label, []).append(float(r["median_ms"]))
    med = {k: {g: statistics.median(v) for g, v in gs.items()} for k, gs in per.items()}
    shared = {k: gs for k, gs in med.items() if len(gs) >= 2}
    gpus = sorted({g for gs in med.values() for g in gs})
    cvs: list[float] = []
    cv_kernel: dict[str, list[float]] = {}
    offset: dict[str, list[float]] = {}
    pair_ratios: dict[tuple[str, str], list[float]] = {}
    for k, gs in shared.items():
        vals = list(gs.values())
        cv = statistics.pstdev(vals) / statistics.fmean(vals)
        cvs.append(cv)
        cv_kernel.setdefault(k[0], []).append(cv)
        center = statistics.median(vals)
        for g, v in gs.items():
            offset.setdefault(g, []).append(v / center)
        for a, b in combinations(sorted(gs), 2):
            pair_ratios.setdefault((a, b), []).append(gs[b] / gs[a])
    # winner changes: per (kernel, source hash, workload) and GPU pair, over the configs both GPUs timed
    by_workload: dict[tuple[str, str, str], dict[str, dict[str, float]]] = {}
    for (kernel, sh, wkey, cfg), gs in shared.items():
        for g, v in gs.items():
            by_workload.setdefault((kernel, sh, wkey), {}).setdefault(g, {})[cfg] = v
    changes = pairs = 0
    for per_gpu in by_workload.values():
        for a, b in combinations(sorted(per_gpu), 2):
            both = per_gpu[a].keys() & per_gpu[b].keys()
            if len(both) < 2:
                continue
            pairs += 1
            changes += min(both, key=per_gpu[a].get) != min(both, key=per_gpu[b].get)

    def stats(v: list[float]) -> dict[str, float]:
        return {"n": len(v), "median": _quantile(v, 0.5), "p10": _quantile(v, 0.1), "p90": _quantile(v, 0.9)}

    return {
        "gpus": gpus,
        "keys": len(med),
        "keys_on_several_gpus": len(shared),
        "cv_median": _quantile(cvs, 0.5) if cvs else None,
        "cv_p95": _quantile(cvs, 0.95) if cvs else None,
        "per_kernel": {k: {"n": len(v), "cv_median": _quantile(v, 0.5), "cv_p95": _quantile(v, 0.95)}
                       for k, v in sorted(cv_kernel.items())},
        "gpu_offset": {g: stats(v) for g, v in sorted(offset.items())},
        "pairs": {f"{b} / {a}": stats(v) for (a, b), v in sorted(pair_ratios.items())},
        "winner_change_rate": changes / pairs if pairs else None,
        "winner_pairs": pairs,
    }


def compare_gpus(paths: list[str | Path]) -> dict[str, Any]:
    return gpu_comparison(gpu_rows(paths))


def format_gpu_report(rep: dict[str, Any]) -> str:
    lines = [f"{len(rep['gpus'])} GPUs, {rep['keys']} keys, {rep['keys_on_several_gpus']} timed on two or more GPUs"]
    if rep["cv_median"] is None:
        lines.append("nothing timed on two GPUs: run `collect --ray --noise N` on a farm, or merge stores of runs on "
                     "other GPUs")
        return "\n".join(lines)
    lines.append(f"CV of the per-GPU medians: median {100 * rep['cv_median']:.2f}%, p95 {100 * rep['cv_p95']:.2f}%")
    for k, v in rep["per_kernel"].items():
        lines.append(f"  {k}: {v['n']} keys, CV median {100 * v['cv_median']:.2f}%, p95 {100 * v['cv_p95']:.2f}%")
    lines.append("per GPU, time / the key's cross-GPU median (p10 / median / p90):")
    for g, s in rep["gpu_offset"].items():
        lines.append(f"  {g}: {s['p10']:.3f} / {s['median']:.3f} / {s['p90']:.3f} over {s['n']} keys")
    lines.append("per GPU pair, ratio of medians (p10 / median / p90):")
    for p, s in rep["pairs"].items():
        lines.append(f"  {p}: {s['p10']:.3f} / {s['median']:.3f} / {s['p90']:.3f} over {s['n']} keys")
    if rep["winner_change_rate"] is not None:
        lines.append(f"fastest config differs between two GPUs in {100 * rep['winner_change_rate']:.1f}% of "
                     f"{rep['winner_pairs']} (workload, GPU pair)s")
    return "\n".join(lines)
