"""The measurement store: SQLite in WAL mode, one row per (device, torch, triton, kernel, kernel version, workload,
config).

The kernel version is the family's `version` (kernels/profiles.py, bumped by hand when a change alters what is
measured), stored as "v<N>" in the `source_hash` column: the column keeps its name so every store and snapshot on disk
stays readable. Rows stored before versions carry a hash of the kernel module's source; every reader maps the hashes
a profile lists (`legacy_hashes`) to their version (`canonical_key`), and opening a store for writing moves them there
in place, so old rows are neither lost nor measured again.

Why SQLite in WAL mode: a collection killed with `kill -9` at any moment keeps every committed batch (a transaction is
either in the WAL in full or not at all), never leaves a half-written row, and several GPU workers can append to the
same file. Rows are only ever inserted (ON CONFLICT DO NOTHING on the unique key), so resuming a collection simply skips
what is stored. The packaged dataset is a gzip-compressed JSON-lines snapshot of the same rows (`export_snapshot`).

Imports only the standard library: this module runs on the GPU machine too.
"""

from __future__ import annotations

import gzip
import json
import math
import sqlite3
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel_gym.kernels.profiles import canonical_key
from kernel_gym.measure.types import FAILURE_STATUSES, OK, Measurement

SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY,
    device TEXT NOT NULL,
    torch_version TEXT NOT NULL,
    triton_version TEXT NOT NULL,
    kernel TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    workload TEXT NOT NULL,
    config TEXT NOT NULL,
    status TEXT NOT NULL,
    median_ms REAL,
    spread REAL,
    repeats INTEGER NOT NULL DEFAULT 0,
    compile_s REAL,
    reason TEXT NOT NULL DEFAULT '',
    source TEXT NOT NULL,
    created REAL NOT NULL,
    CHECK (status != 'ok' OR source = 'interpreter' OR (median_ms IS NOT NULL AND median_ms > 0)),
    CHECK (status = 'ok' OR median_ms IS NULL),
    UNIQUE (device, torch_version, triton_version, kernel, source_hash, workload, config)
);
CREATE INDEX IF NOT EXISTS measurements_kernel ON measurements (kernel, workload);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

COLUMNS = (
    "device", "torch_version", "triton_version", "kernel", "source_hash", "workload", "config",
    "status", "median_ms", "spread", "repeats", "compile_s", "reason", "source", "created",
)
# Where a row was measured (host name, GPU index): columns added after the first stores, so older files gain them
# (empty) when opened, and the snapshot format leaves them out.
ORIGIN_COLUMNS = ("host", "gpu")
# The GPU's clock and power state while the row was timed (Measurement.power, JSON; measure/power.py): added after
# the first stores like the origin columns; older rows and the packaged dataset's have "" (not recorded).
POWER_COLUMN = "power"
CONTEXT_FIELDS = ("device", "torch_version", "triton_version", "kernel", "source_hash")
ROW_FIELDS = ("workload", "config", "status", "median_ms", "spread", "repeats", "compile_s", "reason", "source")
MIN_MEDIAN_MS = 1e-4  # 0.1 us: below any real kernel launch; a smaller stored time is corrupt, not fast
SNAPSHOT_FORMAT = "kernel_gym-measurements"
SNAPSHOT_VERSION = 1


@dataclass(frozen=True)
class Context:
    """What a time depends on besides the workload and config: the machine, the software, the kernel's version
    (`source_hash`: "v<N>", the profile's store_key; a legacy hash in rows stored before versions)."""

    device: str
    torch_version: str
    triton_version: str
    kernel: str
    source_hash: str

    @classmethod
    def current(cls, kernel: str, source_hash: str, device: str | None = None) -> Context:
        """The running machine's context (imports torch and triton; names the CUDA device unless given)."""
        import torch
        import triton

        if device is None:
            device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        return cls(device, torch.__version__, triton.__version__, kernel, source_hash)

    def canonical(self) -> Context:
        """The same context keyed as this checkout keys it (a legacy source hash mapped to its version)."""
        key = canonical_key(self.kernel, self.source_hash)
        return self if key == self.source_hash else Context(self.device, self.torch_version, self.triton_version,
                                                            self.kernel, key)


class MeasurementStore:
    """Append-only SQLite store of measurements. One instance per process (sqlite connections are not shared)."""

    def __init__(self, path: str | Path, timeout_s: float = 60.0, read_only: bool = False) -> None:
        self.path = Path(path)
        if read_only:  # reading never writes: no schema, no WAL switch, no new columns (an MLflow db stays as it is)
            if not self.path.is_file():
                raise FileNotFoundError(f"no measurement store at {self.path}: pass the .sqlite file kernel-gym "
                                        "collect wrote")
            try:
                self.conn = connect_read_only(self.path, timeout_s)
                tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                have = {r[1] for r in self.conn.execute("PRAGMA table_info(measurements)")}
            except sqlite3.DatabaseError as exc:
                if hasattr(self, "conn"):
                    self.conn.close()
                raise ValueError(f"{self.path} is not a readable SQLite measurement store ({exc}): restore it or "
                                 "collect again (kernel-gym collect)") from None
            if "measurements" not in tables or not set(COLUMNS) <= have:
                self.conn.close()
                raise ValueError(f"{self.path} is not a kernel_gym measurement store (no measurements table with "
                                 f"its columns; tables: {sorted(tables) or 'none'}): pass a store written by "
                                 "kernel-gym collect")
            self.read_only = True
            return
        self.read_only = False
        if self.path.is_dir():
            raise ValueError(f"{self.path} is a folder, not a measurement store: pass a file path such as "
                             f"{self.path / 'measurements.sqlite'}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"cannot create the folder of the measurement store {self.path} ({exc.strerror}): pass "
                             "a path in a writable folder") from None
        _refuse_foreign(self.path, timeout_s)
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a process crash (kill -9) loses nothing committed; a power cut may drop the last
            # commits.
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute(f"PRAGMA busy_timeout={int(timeout_s * 1000)}")
            self.conn.executescript(SCHEMA)
            self._add_origin_columns()
            self._rekey_legacy()
        except sqlite3.OperationalError as exc:
            if hasattr(self, "conn"):
                self.conn.close()
            raise write_error(self.path, exc) from None

    def _rekey_legacy(self) -> None:
        """Rows keyed on a legacy source hash move to their family's version key (one transaction; a row whose key
        is already stored under the version stays under its hash, and readers leave it out: canonical_groups)."""
        legacy = [(k, h) for k, h in self.conn.execute("SELECT DISTINCT kernel, source_hash FROM measurements")
                  if canonical_key(k, h) != h]
        if not legacy:
            return
        with self.conn:
            for kernel, old in legacy:
                self.conn.execute("UPDATE OR IGNORE measurements SET source_hash=? WHERE kernel=? AND source_hash=?",
                                  (canonical_key(kernel, old), kernel, old))

    def _add_origin_columns(self) -> None:
        """Older stores lack the host and gpu columns: add them (empty for the rows already there)."""
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(measurements)")}
        for col in (*ORIGIN_COLUMNS, POWER_COLUMN):
            if col not in have:
                try:
                    self.conn.execute(f"ALTER TABLE measurements ADD COLUMN {col} TEXT NOT NULL DEFAULT ''")
                except sqlite3.OperationalError as exc:  # another process added it first, or a read-only file
                    if "duplicate column" not in str(exc) and "readonly" not in str(exc):
                        raise

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> MeasurementStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- writing ---------------------------------------------------------------------------------------------

    def put_many(self, context: Context, measurements: Iterable[Measurement], replace: bool = False,
                 origin: tuple[str, str] | None = None) -> int:
        """Insert a batch in one transaction (all rows or none); rows already stored are kept, or, with replace=True
        (re-measurement), overwritten in the same transaction, so a kill leaves the old row or the new one. origin:
        (host, gpu) the batch was measured on, stored in the host and gpu columns. Returns rows written."""
        now = time.time()
        rows = []
        for m in measurements:
            if m.kernel != context.kernel:
                raise ValueError(f"measurement of kernel {m.kernel!r} given with a context for {context.kernel!r}")
            rows.append((
                context.device, context.torch_version, context.triton_version, context.kernel, context.source_hash,
                m.workload, m.config, m.status, m.median_ms if m.status == OK else None, m.spread, m.repeats,
                m.compile_s, m.reason, m.source, now, *(origin or ("", "")), m.power,
            ))
        if not rows:
            return 0
        before = self.conn.total_changes
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:  # a lock another process holds past the timeout, a read-only file
            raise write_error(self.path, exc) from None
        try:
            on_conflict = "DO NOTHING"  # unlike INSERT OR IGNORE, a CHECK violation still raises
            if replace:
                keys = ("device", "torch_version", "triton_version", "kernel", "source_hash", "workload", "config")
                on_conflict = f"({','.join(keys)}) DO UPDATE SET " + ", ".join(
                    f"{c} = excluded.{c}" for c in (*COLUMNS, *ORIGIN_COLUMNS, POWER_COLUMN) if c not in keys)
            cols = (*COLUMNS, *ORIGIN_COLUMNS, POWER_COLUMN)
            self.conn.executemany(
                f"INSERT INTO measurements ({','.join(cols)}) VALUES ({','.join('?' * len(cols))}) "
                f"ON CONFLICT {on_conflict}",
                rows,
            )
            self.conn.execute("COMMIT")
        except BaseException as exc:
            self.conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError):
                raise write_error(self.path, exc) from None
            raise
        return self.conn.total_changes - before

    def set_meta(self, key: str, value: Any) -> None:
        try:
            self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, json.dumps(value)))
        except sqlite3.OperationalError as exc:
            raise write_error(self.path, exc) from None

    def get_meta(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    # ---- reading ---------------------------------------------------------------------------------------------

    def done_keys(self, context: Context) -> set[tuple[str, str]]:
        """(workload, config) pairs already stored for this context: what a resumed collection skips."""
        cur = self.conn.execute(
            "SELECT workload, config FROM measurements WHERE device=? AND torch_version=? AND triton_version=? "
            "AND kernel=? AND source_hash=?",
            (context.device, context.torch_version, context.triton_version, context.kernel, context.source_hash),
        )
        return set(cur.fetchall())

    def noisy_keys(self, context: Context, max_spread: float) -> list[tuple[str, str]]:
        """(workload, config) of this context's ok rows whose samples spread more than max_spread: what
        `collect --remeasure-noisy` measures again."""
        cur = self.conn.execute(
            "SELECT workload, config FROM measurements WHERE device=? AND torch_version=? AND triton_version=? "
            "AND kernel=? AND source_hash=? AND status=? AND spread > ? ORDER BY workload, config",
            (context.device, context.torch_version, context.triton_version, context.kernel, context.source_hash, OK,
             max_spread),
        )
        return cur.fetchall()

    def count(self, kernel: str | None = None, status: str | None = None, since: float | None = None) -> int:
        """Rows, optionally of one kernel, one status, or written (inserted or replaced) at or after `since`."""
        sql, args = "SELECT COUNT(*) FROM measurements WHERE 1=1", []
        if since is not None:
            sql, args = sql + " AND created >= ?", [*args, since]
        if kernel is not None:
            sql, args = sql + " AND kernel=?", [*args, kernel]
        if status is not None:
            sql, args = sql + " AND status=?", [*args, status]
        return self.conn.execute(sql, args).fetchone()[0]

    def rows(self, kernel: str | None = None, origin: bool = False, ids: bool = False,
             canonical: bool = True) -> Iterator[dict[str, Any]]:
        """Rows as dicts of COLUMNS (and, with origin=True, ORIGIN_COLUMNS and POWER_COLUMN where the file has
        them; with ids=True the row id, for `kernel-gym data --drop-row`), in insertion order; source_hash as
        canonical_key maps it (canonical=False: as stored)."""
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(measurements)")}
        if origin and self.read_only:
            origin = set(ORIGIN_COLUMNS) <= have
        cols = COLUMNS + ORIGIN_COLUMNS if origin else COLUMNS
        if origin and POWER_COLUMN in have:
            cols = (*cols, POWER_COLUMN)
        if ids:
            cols = ("id", *cols)
        sql = f"SELECT {','.join(cols)} FROM measurements"
        cur = self.conn.execute(sql + (" WHERE kernel=? ORDER BY id" if kernel else " ORDER BY id"),
                                (kernel,) if kernel else ())
        for row in cur:
            out = dict(zip(cols, row))
            if canonical:
                out["source_hash"] = canonical_key(out["kernel"], out["source_hash"])
            yield out

    def drop_rows(self, ids: Iterable[int]) -> int:
        """Delete rows by id (an implausible or damaged row a reader refused, naming its id); returns rows deleted."""
        ids = [int(i) for i in ids]
        try:
            with self.conn:
                n = sum(self.conn.execute("DELETE FROM measurements WHERE id=?", (i,)).rowcount for i in ids)
        except sqlite3.OperationalError as exc:
            raise write_error(self.path, exc) from None
        return n

    def integrity_check(self) -> str:
        """SQLite's own integrity check plus the row-level invariants; 'ok' when all hold."""
        result = self.conn.execute("PRAGMA integrity_check").fetchone()[0]
        if result != "ok":
            return result
        bad = self.conn.execute(
            "SELECT COUNT(*) FROM measurements WHERE (status='ok' AND source!='interpreter' AND "
            "(median_ms IS NULL OR median_ms<=0)) OR (status!='ok' AND median_ms IS NOT NULL) "
            "OR workload='' OR config=''"
        ).fetchone()[0]
        return "ok" if bad == 0 else f"{bad} rows violate the status/median invariants"

    # ---- snapshot (package data) -------------------------------------------------------------------------------

    def export_snapshot(self, path: str | Path) -> int:
        """Write every row as gzip JSON lines: a header line, then per context a {"context": ...} line followed by
        its rows as arrays in ROW_FIELDS order (compact: the context is not repeated). Returns rows written."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        n = 0
        tmp = path.with_suffix(path.suffix + ".tmp")
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(measurements)")}
        fields = (*ROW_FIELDS, POWER_COLUMN) if POWER_COLUMN in have else ROW_FIELDS  # readers map by the header
        with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=9) as f:
            f.write(json.dumps({"format": SNAPSHOT_FORMAT, "version": SNAPSHOT_VERSION, "fields": fields}) + "\n")
            contexts = self.conn.execute(
                f"SELECT DISTINCT {','.join(CONTEXT_FIELDS)} FROM measurements ORDER BY {','.join(CONTEXT_FIELDS)}"
            ).fetchall()
            for ctx in contexts:
                f.write(json.dumps({"context": dict(zip(CONTEXT_FIELDS, ctx))}) + "\n")
                cur = self.conn.execute(
                    f"SELECT {','.join(fields)} FROM measurements WHERE "
                    + " AND ".join(f"{c}=?" for c in CONTEXT_FIELDS) + " ORDER BY workload, config",
                    ctx,
                )
                for row in cur:
                    f.write(json.dumps(list(row), separators=(",", ":")) + "\n")
                    n += 1
        tmp.replace(path)
        return n

    def import_snapshot(self, path: str | Path) -> int:
        """Insert a snapshot's rows (existing keys kept). Returns rows inserted."""
        n = 0
        for context, measurements in iter_snapshot(path):
            n += self.put_many(context, measurements)
        return n


def connect_read_only(path: Path, timeout_s: float = 60.0) -> sqlite3.Connection:
    """A connection that writes nothing, also in a read-only folder. There SQLite cannot create a WAL store's -shm
    file, so the store is read as an immutable file; unless its -wal holds rows not yet in the main file: reading
    without them would silently drop committed rows (a collection killed with kill -9 leaves them there), so that is
    an error saying how to read them."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout_s)
    try:
        conn.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
        return conn
    except sqlite3.OperationalError as exc:
        conn.close()
        if "readonly" not in str(exc) and "unable to open" not in str(exc):
            raise
    wal = path.with_name(path.name + "-wal")
    if wal.is_file() and wal.stat().st_size:
        raise ValueError(f"{path}: its write-ahead log {wal.name} holds rows not yet in the main file, which SQLite "
                         f"cannot read in a read-only folder: copy {path.name} and {wal.name} together to a writable "
                         f"folder and pass the copy (or make {path.parent} writable)")
    return sqlite3.connect(f"{path.resolve().as_uri()}?immutable=1", uri=True, timeout=timeout_s)


def write_error(path: Path, exc: sqlite3.OperationalError) -> ValueError:
    """A one-line error for a store SQLite cannot write, naming the fix (rows already stored are untouched: every
    write is one transaction)."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        fix = ("another process (a running kernel-gym collect or data --merge?) holds its write lock: wait for it to "
               "finish, then run again")
    elif "readonly" in text or "unable to open" in text:
        fix = f"make {path.name} and its folder writable, or pass a path in a writable folder"
    elif "full" in text or "disk" in text:
        fix = "free disk space, then run again"
    else:
        fix = "check the file and its folder, then run again"
    return ValueError(f"cannot write the measurement store {path} ({text}); the rows already stored are kept: {fix}")


def _refuse_foreign(path: Path, timeout_s: float) -> None:
    """An existing file is written only when it is a measurement store (or a SQLite file without tables): a file
    that is not SQLite is left as it is, and kernel_gym's tables never go into another database (an MLflow store)."""
    if not (path.is_file() and path.stat().st_size):
        return
    try:
        conn = connect_read_only(path, timeout_s)
        try:
            tables = conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{path} is not a SQLite measurement store ({exc}); it was left as it is: pass a new path "
                         "or a store kernel-gym collect wrote") from None
    if tables:  # a database of another tool or schema: the read-only check names its tables and is the error
        MeasurementStore(path, timeout_s, read_only=True).close()


def iter_snapshot(path: str | Path) -> Iterator[tuple[Context, list[Measurement]]]:
    """(context, measurements) groups of a snapshot written by `export_snapshot`."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no measurement snapshot at {path}: collect one (scripts/collect.py --out {path})")
    try:
        groups = list(_read_snapshot(path))
    except (EOFError, OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: truncated or corrupt snapshot ({type(exc).__name__}: {exc}): restore the file "
                         "(git checkout, or export it again with scripts/collect.py --out)") from None
    yield from canonical_groups(groups)


def canonical_groups(groups: list[tuple[Context, list[Measurement]]]) -> Iterator[tuple[Context, list[Measurement]]]:
    """Groups as stored, keyed as this checkout keys them: a legacy source hash becomes its version key; a legacy
    row whose key is also stored under the version key is left out (that row is the later measurement of the same
    code)."""
    current = {(ctx, m.workload, m.config) for ctx, ms in groups if ctx.canonical() is ctx for m in ms}
    for ctx, ms in groups:
        key = ctx.canonical()
        yield (ctx, ms) if key is ctx else (key, [m for m in ms if (key, m.workload, m.config) not in current])


def check_time(path: Path | str, where: str, m: Measurement) -> None:
    """A stored time must be finite and at least MIN_MEDIAN_MS; else a one-line error naming file and row."""
    v = m.median_ms
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < MIN_MEDIAN_MS:
        raise ValueError(f"{path}: {where} ({m.kernel} {m.workload} {m.config}): median_ms {v!r} is not a plausible "
                         f"kernel time (finite and >= {MIN_MEDIAN_MS} ms); re-measure or delete that row"
                         f"{_drop_hint(path, where)}")


# A stored ok time below this share of the workload's strict roofline bound (measured H200 ceilings; MoE: only its
# top_k experts' weights read) is physically implausible: a corrupt or crafted row, which would become the oracle.
# The packaged data's lowest ratio is 0.94 (decode at batch 256), so 0.5 leaves room for any real kernel.
ROOFLINE_FLOOR = 0.5
_FLOORS: dict[tuple[str, str], float | None] = {}


def roofline_floor_ms(kernel: str, workload_key: str) -> float | None:
    """ROOFLINE_FLOOR x the strict roofline time (ms) of a workload; None for kernels without a roofline."""
    key = (kernel, workload_key)
    if key in _FLOORS:
        return _FLOORS[key]
    from kernel_gym.kernels.workloads import MoEWorkload, workload_from_key
    from kernel_gym.measure.roofline import kernel_roofline, op_s

    floor = None
    try:
        w = workload_from_key(kernel, workload_key)
        b = {"float32": 4, "float16": 2, "bfloat16": 2}.get(getattr(w, "dtype", "bfloat16"), 1)
        if isinstance(w, MoEWorkload):  # fewest bytes any routing reads: top_k experts' weights
            flops = 2.0 * w.num_tokens * w.top_k * 3 * w.hidden * w.intermediate
            nbytes = b * min(w.top_k, w.num_experts) * 3 * w.hidden * w.intermediate
        else:
            flops, nbytes = kernel_roofline(kernel, w, b)
        floor = ROOFLINE_FLOOR * op_s(flops, nbytes) * 1e3
    except (TypeError, KeyError, ValueError):
        floor = None  # no roofline for this kernel (or a workload checked elsewhere)
    if len(_FLOORS) < 1 << 20:
        _FLOORS[key] = floor
    return floor


STATUSES = (OK, *FAILURE_STATUSES)


def check_row(path: Path | str, where: str, m: Measurement, strict: bool = False) -> None:
    """What every reader of stored rows checks (data, the recorded backend, merge): a plausible time (check_time and
    the roofline floor); strict (merge, which writes what it reads into another store): also a known status and
    JSON workload and config, so a permuted or damaged row is not copied into a store that then cannot be read."""
    hint = _drop_hint(path, where)
    if strict:
        _check_fields(path, where, m, hint)
    check_time(path, where, m)
    if m.status == OK and m.median_ms is not None and m.source != "interpreter":
        floor = roofline_floor_ms(m.kernel, m.workload)
        if floor is not None and m.median_ms < floor:
            raise ValueError(f"{path}: {where} ({m.kernel} {m.workload} {m.config}): median_ms {m.median_ms:g} is "
                             f"below {ROOFLINE_FLOOR:g} x the workload's roofline bound ({floor / ROOFLINE_FLOOR:.4g}"
                             f" ms): not a plausible time; re-measure it or drop the row{hint}")


def _check_fields(path: Path | str, where: str, m: Measurement, hint: str) -> None:
    if m.status not in STATUSES:
        raise ValueError(f"{path}: {where}: status {m.status!r} is not one of {list(STATUSES)}: a damaged or "
                         f"permuted row{hint}")
    for name, text in (("workload", m.workload), ("config", m.config)):
        try:
            ok = isinstance(text, str) and isinstance(json.loads(text), dict)
        except (json.JSONDecodeError, TypeError):
            ok = False
        if not ok:
            raise ValueError(f"{path}: {where}: {name} {str(text)[:80]!r} is not a JSON object: a damaged or "
                             f"permuted row{hint}")


def _drop_hint(path: Path | str, where: str) -> str:
    if where.startswith("row id "):
        return f" (kernel-gym data --db {path} --drop-row {where.removeprefix('row id ').split()[0]})"
    return ""


def _read_snapshot(path: Path) -> Iterator[tuple[Context, list[Measurement]]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        header = json.loads(f.readline() or "{}")
        if header.get("format") != SNAPSHOT_FORMAT or header.get("version") != SNAPSHOT_VERSION:
            raise ValueError(f"{path} is not a kernel_gym measurement snapshot v{SNAPSHOT_VERSION} (header {header})")
        fields = header["fields"]
        context: Context | None = None
        batch: list[Measurement] = []
        seen: dict[tuple[Context, str, str], int] = {}  # a key stored twice would be read first by one reader and
        for lineno, line in enumerate(f, start=2):      # last by another: refused
            item = json.loads(line)
            if isinstance(item, dict):
                if context is not None:
                    yield context, batch
                try:
                    context, batch = Context(**item["context"]), []
                except (KeyError, TypeError) as exc:
                    raise ValueError(f"{path}: line {lineno}: malformed context line ({exc}): re-export the "
                                     "snapshot") from None
                continue
            if context is None:
                raise ValueError(f"{path}: line {lineno} is a row before any context line: re-export the snapshot")
            if not isinstance(item, list) or len(item) != len(fields):
                raise ValueError(f"{path}: line {lineno}: a row of {len(fields)} fields expected: re-export the "
                                 "snapshot")
            row = dict(zip(fields, item))
            m = Measurement(kernel=context.kernel, **row)
            check_row(path, f"line {lineno}", m)
            first = seen.setdefault((context, m.workload, m.config), lineno)
            if first != lineno:
                raise ValueError(f"{path}: line {lineno} repeats the key of line {first} ({m.kernel} {m.workload} "
                                 f"{m.config}): keep one of them and re-export the snapshot")
            batch.append(m)
        if context is not None:
            yield context, batch


def load_rows(path: str | Path) -> list[tuple[Context, list[Measurement]]]:
    """All rows of a snapshot (.jsonl.gz) or a store (.sqlite / .db), grouped by context."""
    path = Path(path)
    if path.suffix == ".gz":
        return list(iter_snapshot(path))
    if not path.exists():
        raise FileNotFoundError(f"no measurement store at {path}: pass the .sqlite store or .jsonl.gz snapshot that "
                                "collect / tune wrote (--db, --out)")
    store = MeasurementStore(path, read_only=True)
    try:
        groups: dict[Context, list[Measurement]] = {}
        for row in store.rows(origin=True, ids=True, canonical=False):
            ctx = Context(*(row[c] for c in CONTEXT_FIELDS))
            m = Measurement(kernel=row["kernel"], power=row.get(POWER_COLUMN) or "",
                            **{f: row[f] for f in ROW_FIELDS})
            check_row(path, f"row id {row['id']}", m)
            groups.setdefault(ctx, []).append(m)
        merged: dict[Context, list[Measurement]] = {}
        for ctx, ms in canonical_groups(list(groups.items())):
            merged.setdefault(ctx, []).extend(ms)
        return list(merged.items())
    except sqlite3.DatabaseError as exc:
        raise ValueError(f"{path}: truncated or corrupt SQLite store ({exc}): restore it or collect again") from None
    finally:
        store.close()


PACKAGED_SNAPSHOT = Path(__file__).resolve().parent.parent / "data" / "h200_measurements.jsonl.gz"
