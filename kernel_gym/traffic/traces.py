"""Loaders for published LLM serving traces, and `load_trace(name_or_path)`.

Formats (columns as published; origins and licences: README.md, Data and licences):
- Azure LLM inference trace 2023 (CSV): TIMESTAMP (absolute datetime), ContextTokens, GeneratedTokens.
- Mooncake (JSONL): timestamp (ms from 0), input_length, output_length, hash_ids (512-token blocks).
- Alibaba's Qwen Bailian usage traces (JSONL, the same fields plus chat_id, parent_chat_id, turn, type): timestamp in
  seconds, hash_ids of 16-token blocks. Told apart from Mooncake by chat_id; a file name with `blksz_N` (as the
  published `qwen_traceA_blksz_16.jsonl`) sets the block size of either.
- BurstGPT (CSV): Timestamp (s), [Session ID, Elapsed time,] Model, Request tokens, Response tokens, Total tokens,
  Log Type.
- Your own requests (CSV): arrival_s (seconds, any origin), prompt_tokens, output_tokens; other columns ignored. The
  format to write a deployment's request log in.

A gzip-compressed file (`.csv.gz`, `.jsonl.gz`: recognised by its gzip header, whatever its name) is read as the
text inside it.

Every trace becomes a `Trace`: arrival times in seconds from the first arrival, prompt and output token counts.
Bad input raises `TraceError` naming the file, the line and the fix. One repair is documented and counted instead of
raised: rows with zero prompt or zero output tokens (BurstGPT records failed requests that way) are dropped and
counted in `Trace.repairs["zero_token_rows_dropped"]`, because they carry no work to replay. Negative counts,
non-numeric fields, missing columns, decreasing timestamps, timestamps in a finer unit than the format's (epoch
milliseconds in a seconds column), archives other than gzip and empty files are errors: replaying a guess would be a
silent wrong replay.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import math
import os
import re
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

FORMATS = ("azure", "mooncake", "burstgpt", "plain")
PLAIN_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")

# Where the published trace files are looked up by name: the folder in $KERNEL_GYM_TRACES (read at each lookup), or
# the traces_dir given to load_trace. There is no default folder; the bundled excerpt needs neither.
TRACES_ENV = "KERNEL_GYM_TRACES"
BUNDLED_DIR = Path(__file__).resolve().parents[1] / "data" / "traces"
BUNDLED_FILE = "AzureLLMInferenceTrace_conv_first10min.csv"
NAMED_TRACES = {
    "azure-conv": "AzureLLMInferenceTrace_conv.csv",
    "azure-code": "AzureLLMInferenceTrace_code.csv",
    "mooncake": "mooncake_synthetic_trace.jsonl",
    "burstgpt": "BurstGPT_1_first400rows.csv",
}


class TraceError(ValueError):
    """A trace file that cannot be replayed as is; the message names file, line and fix."""


class TraceWarning(UserWarning):
    """A trace that loads but whose numbers look like another unit than its format's (the replay would mislead)."""


# A Mooncake trace read at over this many requests per second (with at least SECONDS_CHECK_MIN requests) most likely
# holds seconds where the format says milliseconds: the published traces run at 1-30 requests/s.
SECONDS_CHECK_RATE, SECONDS_CHECK_MIN = 1000.0, 20


@dataclass(frozen=True)
class Trace:
    """Requests over time: arrival_s (seconds, non-decreasing; loaders start it at 0 on the first arrival, synthetic
    profiles at the profile's start), prompt and output token counts (>= 1). `repairs` counts documented repairs."""

    name: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str = ""
    repairs: dict[str, int] = field(default_factory=dict)
    # Prefix-cache block ids per request (Mooncake's hash_ids: block j of a prompt covers tokens [j*B, (j+1)*B) with
    # B = hash_block_tokens; equal ids = equal prefixes), or None when the trace carries none.
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    hash_block_tokens: int = 0

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if self.hash_ids is not None:
            if len(self.hash_ids) != n:
                raise ValueError(f"trace {self.name!r}: {len(self.hash_ids)} hash_ids lists for {n} requests")
            if self.hash_block_tokens < 1:
                raise ValueError(f"trace {self.name!r}: hash_ids need hash_block_tokens >= 1 (tokens per block)")
            object.__setattr__(self, "hash_ids", tuple(tuple(int(h) for h in ids) for ids in self.hash_ids))
        if not (len(self.prompt_tokens) == len(self.output_tokens) == n):
            raise ValueError(f"trace {self.name!r}: arrival_s, prompt_tokens, output_tokens differ in length")
        if n == 0:
            raise ValueError(f"trace {self.name!r} has no requests; give at least one")
        object.__setattr__(self, "arrival_s", np.asarray(self.arrival_s, dtype=np.float64))
        object.__setattr__(self, "prompt_tokens", np.asarray(self.prompt_tokens, dtype=np.int64))
        object.__setattr__(self, "output_tokens", np.asarray(self.output_tokens, dtype=np.int64))
        if not np.all(np.isfinite(self.arrival_s)):
            bad = int(np.flatnonzero(~np.isfinite(self.arrival_s))[0])
            raise ValueError(f"trace {self.name!r}: arrival_s[{bad}] is {self.arrival_s[bad]}; arrival times must be "
                             "finite seconds")
        if np.any(np.diff(self.arrival_s) < 0):
            raise ValueError(f"trace {self.name!r}: arrival_s must be non-decreasing; sort the requests by arrival")
        if self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1:
            raise ValueError(f"trace {self.name!r}: prompt_tokens and output_tokens must be >= 1")

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0])

    @property
    def mean_rate(self) -> float:
        """Requests per second over the trace's span."""
        return len(self) / max(self.duration_s, 1e-9)

    def window(self, start_s: float, end_s: float) -> Trace:
        """The requests arriving in [start_s, end_s), re-based so the first arrives at 0."""
        if end_s <= start_s:
            raise ValueError(f"window [{start_s:g}, {end_s:g}) s is empty: END must be after START (e.g. 0:300)")
        lo, hi = np.searchsorted(self.arrival_s, [start_s, end_s], side="left")
        if hi <= lo:
            raise ValueError(f"trace {self.name!r} has no arrivals in [{start_s:g}, {end_s:g}) s: its {len(self)} "
                             f"requests arrive in [{self.arrival_s[0]:g}, {self.arrival_s[-1]:g}] s; choose a window "
                             "that overlaps them")
        t = self.arrival_s[lo:hi]
        return Trace(f"{self.name}[{start_s:g}:{end_s:g}s]", t - t[0], self.prompt_tokens[lo:hi],
                     self.output_tokens[lo:hi], self.source, dict(self.repairs),
                     None if self.hash_ids is None else self.hash_ids[lo:hi], self.hash_block_tokens)

    def head(self, n: int) -> Trace:
        """The first n requests."""
        return Trace(f"{self.name}[:{n}]", self.arrival_s[:n], self.prompt_tokens[:n], self.output_tokens[:n],
                     self.source, dict(self.repairs), None if self.hash_ids is None else self.hash_ids[:n],
                     self.hash_block_tokens)

    def scale_rate(self, factor: float) -> Trace:
        """Compress time by `factor` (factor 2 = twice the arrival rate, same lengths and burst shape)."""
        if factor <= 0:
            raise ValueError(f"rate factor must be > 0, got {factor}")
        return Trace(f"{self.name}x{factor:g}", self.arrival_s / factor, self.prompt_tokens, self.output_tokens,
                     self.source, dict(self.repairs), self.hash_ids, self.hash_block_tokens)


def _err(path: Path, line: int, what: str, fix: str) -> TraceError:
    return TraceError(f"{path}:{line}: {what}; fix: {fix}")


MAX_TOKENS = 10_000_000  # per request: far beyond any context window; larger counts are corrupt rows
MAX_SPAN_S = 400 * 86400.0  # first to last request: the public traces span days to four months
# A time this many seconds from 1970 (year ~5100) is no time in seconds: epoch milliseconds are ~1.7e12, seconds 1.7e9
FINER_UNIT_S = 1e11


def _int_field(path: Path, line: int, column: str, text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise _err(path, line, f"column {column!r} holds {text!r}, not a number",
                   "correct or delete that row") from None
    if not math.isfinite(value) or value > MAX_TOKENS:
        raise _err(path, line, f"column {column!r} holds {text!r}, not a plausible token count (0 to {MAX_TOKENS:,})",
                   "correct or delete that row")
    if value != int(value):
        raise _err(path, line, f"column {column!r} holds {text!r}, not a whole token count",
                   "correct or delete that row")
    if value < 0:
        raise _err(path, line, f"column {column!r} is negative ({text})", "correct or delete that row")
    return int(value)


def _finish(path: Path, name: str, rows: list[tuple[int, float, int, int]], repairs: dict[str, int],
            unit: str = "seconds") -> Trace:
    """rows: (line, time_s, prompt, output). Drops zero-token rows (counted), checks order and unit (`unit`: the
    format's, for the message)."""
    if not rows:
        raise _err(path, 1, "the file has no data rows", "give a trace with at least one request")
    kept = [r for r in rows if r[2] > 0 and r[3] > 0]
    dropped = len(rows) - len(kept)
    repairs = dict(repairs, zero_token_rows_dropped=dropped)
    if not kept:
        raise _err(path, rows[0][0], f"all {len(rows)} rows have zero prompt or output tokens",
                   "give a trace with at least one request that has tokens")
    for line, t, _, _ in kept:
        if abs(t) >= FINER_UNIT_S:  # 1.7e12 "seconds": epoch milliseconds (or finer) in a seconds column
            raw = t * {"milliseconds": 1e3}.get(unit, 1.0)  # as the file writes it
            read = f"{raw:.0f} ({t:.0f} s)" if raw != t else f"{t:.0f} s"
            raise _err(path, line, f"timestamp {read} is {abs(t) / 3.156e7:,.0f} years from 1970: the times are "
                       f"in a finer unit than {unit} (epoch milliseconds, microseconds or nanoseconds)",
                       f"convert the time column to {unit} (milliseconds / 1000, ...)")
    prev_line, prev_t = kept[0][0], kept[0][1]
    for line, t, _, _ in kept[1:]:
        if t < prev_t:
            raise _err(path, line, f"timestamp {t:.6f} s is before the one on line {prev_line} ({prev_t:.6f} s)",
                       "sort the file by its timestamp column")
        if t - kept[0][1] > MAX_SPAN_S:  # a year-9999 stamp among 2023 ones: a replay of centuries
            raise _err(path, line, f"timestamp {t:.0f} s is {(t - kept[0][1]) / 86400:.0f} days after the first "
                       f"request (line {kept[0][0]}); a trace spans at most {MAX_SPAN_S / 86400:.0f} days",
                       "correct or delete that row")
        prev_line, prev_t = line, t
    arr = np.array([r[1:] for r in kept], dtype=np.float64)
    t = arr[:, 0] - arr[0, 0]
    return Trace(name, t, arr[:, 1].astype(np.int64), arr[:, 2].astype(np.int64), str(path), repairs)


GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def _open_text(path: Path, encoding: str = "utf-8", newline: str | None = None):
    """The file as text, through gzip when it is gzip-compressed (the published traces are often shipped so)."""
    if is_gzip(path):
        return gzip.open(path, "rt", encoding=encoding, newline=newline)
    return open(path, encoding=encoding, newline=newline)


def _stem(path: Path) -> str:
    """'trace.csv.gz' -> 'trace', 'trace.csv' -> 'trace'."""
    return Path(path.name.removesuffix(".gz")).stem


def plain_suffix(path: Path) -> str:
    """The suffix under a `.gz`: 'trace.jsonl.gz' -> '.jsonl' (a compressed file is read through gzip)."""
    return Path(path.name.removesuffix(".gz")).suffix


def _open_csv(path: Path, required: tuple[str, ...], fmt: str):
    """(header, reader, file) after checking the header holds the format's columns."""
    fh = _open_text(path, encoding="utf-8-sig", newline="")
    reader = csv.reader(fh)
    header = next(reader, None)
    if header is None:
        fh.close()
        raise _err(path, 1, "the file is empty", f"give a {fmt} trace with header {list(required)} and data rows")
    header = [h.strip() for h in header]
    missing = [c for c in required if c not in header]
    if missing:
        fh.close()
        raise _err(path, 1, f"header {header} lacks column(s) {missing} of the {fmt} format",
                   f"use the published {fmt} file with columns {list(required)}")
    return header, reader, fh


_AZURE_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:\.(\d+))?\s*(Z|[+-]\d{2}:?\d{2})?$")


def _parse_azure_time(text: str) -> float:
    """'2023-11-16 18:15:46.6805900' -> POSIX seconds (7 fractional digits: more than datetime parses). A UTC offset
    ('+05:00', 'Z') is kept; without one the time is UTC, as the published trace's is."""
    match = _AZURE_TIME.match(text.strip())
    if match is None:
        raise ValueError(text)
    base, frac, offset = match.groups()
    stamp = datetime.fromisoformat(base)
    if offset and offset != "Z":
        sign = 1 if offset[0] == "+" else -1
        hh, mm = int(offset[1:3]), int(offset[-2:])
        stamp = stamp.replace(tzinfo=timezone(sign * timedelta(hours=hh, minutes=mm)))
    else:
        stamp = stamp.replace(tzinfo=timezone.utc)
    if not 2000 <= stamp.year <= 2100:
        raise ValueError(text)  # year 9999 and friends: not a time a serving trace was recorded at
    seconds = stamp.timestamp()
    if frac:
        seconds += int(frac) / 10 ** len(frac)
    return seconds


def _load_csv(path: Path, columns: tuple[str, ...], kind: str, name: str | None,
              parse_time: Callable[[str], float], time_hint: str) -> Trace:
    """The CSV formats share their shape: a header naming (time, prompt tokens, output tokens) columns among others."""
    header, reader, fh = _open_csv(path, columns, kind)
    it, ip, io = (header.index(c) for c in columns)
    rows = []
    with fh:
        for line, rec in enumerate(reader, start=2):
            if not rec:
                continue
            if len(rec) < len(header):
                raise _err(path, line, f"row has {len(rec)} fields, the header has {len(header)}",
                           "correct or delete that row")
            try:
                t = parse_time(rec[it])
            except ValueError:
                raise _err(path, line, f"{columns[0]} {rec[it]!r} is not {time_hint}",
                           _datetime_fix(rec[it], columns) or "correct or delete that row") from None
            if not math.isfinite(t):
                raise _err(path, line, f"{columns[0]} {rec[it]!r} is not a finite time", "correct or delete that row")
            rows.append((line, t, _int_field(path, line, columns[1], rec[ip]),
                         _int_field(path, line, columns[2], rec[io])))
    return _finish(path, name or _stem(path), rows, {})


def _datetime_fix(text: str, columns: tuple[str, ...]) -> str:
    """The fix for a datetime in a column of seconds (a log's ISO timestamps): whole files are written that way, so
    'correct that row' would not help."""
    if columns == AZURE_COLUMNS:
        return ""
    try:
        _parse_azure_time(text)
    except ValueError:
        return ""
    return (f"write {columns[0]} as seconds (e.g. since the first request), or rename the columns to "
            f"{list(AZURE_COLUMNS)}: the Azure format, whose {AZURE_COLUMNS[0]} is a datetime")


def load_azure(path: str | Path, name: str | None = None) -> Trace:
    """Azure LLM inference trace 2023 (Splitwise): TIMESTAMP, ContextTokens, GeneratedTokens."""
    return _load_csv(Path(path), AZURE_COLUMNS, "Azure LLM inference trace", name, _parse_azure_time,
                     "a datetime like '2023-11-16 18:15:46.6805900'")


def load_burstgpt(path: str | Path, name: str | None = None) -> Trace:
    """BurstGPT: Timestamp (s), Request tokens, Response tokens (other columns ignored).

    Rows with zero request or response tokens are failed requests in BurstGPT; they are dropped and counted.
    """
    return _load_csv(Path(path), BURSTGPT_COLUMNS, "BurstGPT", name, float, "a number of seconds")


def load_plain(path: str | Path, name: str | None = None) -> Trace:
    """A request log in kernel-gym's own CSV: arrival_s (seconds), prompt_tokens, output_tokens (others ignored)."""
    return _load_csv(Path(path), PLAIN_COLUMNS, "kernel-gym request CSV", name, float, "a number of seconds")


MOONCAKE_BLOCK_TOKENS = 512  # tokens per hash_ids block in the published Mooncake traces
BAILIAN_BLOCK_TOKENS = 16  # the same in Alibaba's Qwen Bailian traces (their files say so: qwen_*_blksz_16.jsonl)
BAILIAN_FIELD = "chat_id"  # a Bailian record's own field: its timestamps are seconds, Mooncake's milliseconds


def _block_tokens(path: Path, default: int) -> int:
    """Tokens per hash_ids block: `blksz_N` in the file name (the Bailian traces' convention), else `default`."""
    m = re.search(r"blksz_(\d+)", path.name)
    if m and int(m.group(1)) < 1:
        raise _err(path, 1, f"the file name says hash blocks of {m.group(1)} tokens", "rename it with blksz_N, N >= 1")
    return int(m.group(1)) if m else default


def load_mooncake(path: str | Path, name: str | None = None) -> Trace:
    """Mooncake JSONL: timestamp (ms), input_length, output_length, and hash_ids when present (prefix-cache blocks
    of MOONCAKE_BLOCK_TOKENS tokens, kept in Trace.hash_ids for the simulator's prefix cache). A Bailian trace
    (records with chat_id) has the same fields with timestamps in seconds and 16-token blocks; read as Mooncake it
    would replay 1,000 times too fast. The file is one or the other: records are checked against its first."""
    path = Path(path)
    rows = []
    hashes: dict[int, tuple[int, ...]] = {}
    bailian: bool | None = None  # decided by the first record
    unit = "milliseconds"
    with _open_text(path, encoding="utf-8-sig") as fh:  # a BOM (Windows tools write one) is no part of the JSON
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            if not rows and text.lstrip().startswith("["):
                raise _err(path, line, "a JSON array, not JSON Lines (one object per line)",
                           "write one request object per line, e.g. jq -c '.[]' FILE > FILE.jsonl")
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as exc:
                raise _err(path, line, f"not a JSON object ({exc.msg})", "correct or delete that line") from None
            if not isinstance(rec, dict):
                raise _err(path, line, "not a JSON object", "one object per line")
            missing = [k for k in MOONCAKE_FIELDS if k not in rec]
            if missing:
                raise _err(path, line, f"record lacks field(s) {missing} of the Mooncake JSONL format (its fields: "
                           f"{sorted(rec)[:8]})",
                           f"give every line the fields {list(MOONCAKE_FIELDS)} (timestamp in milliseconds), or "
                           f"write the requests as a CSV with columns {list(PLAIN_COLUMNS)} (seconds, tokens, tokens)")
            if bailian is None:
                bailian = BAILIAN_FIELD in rec
                unit = "seconds" if bailian else "milliseconds"
            elif (BAILIAN_FIELD in rec) != bailian:
                first, this = ("Bailian", "Mooncake") if bailian else ("Mooncake", "Bailian")
                raise _err(path, line, f"a {this} record in a {first} trace (the first record "
                           f"{'has' if bailian else 'lacks'} {BAILIAN_FIELD}: timestamps in {unit})",
                           "keep one trace format per file")
            t_ms = rec["timestamp"]
            if isinstance(t_ms, bool) or not isinstance(t_ms, (int, float)) or not math.isfinite(t_ms):
                raise _err(path, line, f"timestamp {t_ms!r} is not a number of {unit}",
                           "correct or delete that line")
            if t_ms < 0:
                raise _err(path, line, f"timestamp {t_ms} is negative", "correct or delete that line")
            if bailian:
                t_ms = t_ms * 1000.0
            for k in ("input_length", "output_length"):  # JSON numbers only: "12" is a damaged or hand-edited line
                if isinstance(rec[k], bool) or not isinstance(rec[k], (int, float)):
                    raise _err(path, line, f"{k} {rec[k]!r} is not a JSON number", "correct or delete that line")
            rows.append((line, t_ms / 1000.0, _int_field(path, line, "input_length", str(rec["input_length"])),
                         _int_field(path, line, "output_length", str(rec["output_length"]))))
            ids = rec.get("hash_ids")
            if ids is not None:
                if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in ids):
                    raise _err(path, line, "hash_ids is not a list of integers", "correct or delete that line")
                hashes[line] = tuple(ids)
    if not rows:
        raise _err(path, 1, "the file is empty", f"give a Mooncake JSONL trace with fields {list(MOONCAKE_FIELDS)}")
    trace = _finish(path, name or _stem(path), rows, {}, unit)
    if not bailian and len(trace) >= SECONDS_CHECK_MIN and trace.mean_rate > SECONDS_CHECK_RATE:
        warnings.warn(f"{path}: {len(trace)} requests within {trace.duration_s * 1e3:.0f} ms of timestamps "
                      f"({trace.mean_rate:.0f} requests/s): Mooncake timestamps are milliseconds; if yours are "
                      f"seconds, multiply them by 1000, or write the trace as a CSV with columns {list(PLAIN_COLUMNS)}",
                      TraceWarning, stacklevel=2)
    if not hashes:
        return trace
    kept = [r[0] for r in rows if r[2] > 0 and r[3] > 0]  # the rows _finish kept, in order
    block = _block_tokens(path, BAILIAN_BLOCK_TOKENS if bailian else MOONCAKE_BLOCK_TOKENS)
    # a prompt has at most ceil(prompt / block) blocks: when most records hold more, the blocks are smaller than
    # the format's (a trace of 16-token blocks read as Mooncake's 512 would share 32 times too much per hit)
    with_ids = [(line, prompt, hashes[line]) for line, _, prompt, out in rows if line in hashes and prompt and out]
    over = [(line, prompt, ids) for line, prompt, ids in with_ids if len(ids) > -(-prompt // block)]
    if 2 * len(over) > len(with_ids):
        line, prompt, ids = over[0]
        fmt = "Bailian" if bailian else "Mooncake"
        raise _err(path, line, f"{len(ids)} hash_ids for a {prompt}-token prompt (and {len(over) - 1} more records "
                   f"like it): blocks of {block} tokens ({fmt}) give at most {-(-prompt // block)}, so its blocks are "
                   f"smaller (about {max(1, prompt // len(ids))} tokens)",
                   "name the file with its block size, e.g. trace_blksz_16.jsonl")
    return dataclasses.replace(trace, hash_ids=tuple(hashes.get(line, ()) for line in kept), hash_block_tokens=block)


def detect_format(path: str | Path) -> str:
    """'azure' | 'mooncake' | 'burstgpt' | 'plain' from the extension and header."""
    path = Path(path)
    if plain_suffix(path) in (".jsonl", ".json"):
        return "mooncake"
    with _open_text(path, encoding="utf-8-sig", newline="") as fh:
        first = fh.readline()
        rest = fh.read(1 << 16) if not first.strip() else ""
    if not first.strip():
        if rest.strip():
            raise _err(path, 1, "the first line is blank; the header row must come first",
                       "delete the blank line(s) above the header")
        raise _err(path, 1, "the file is empty", "give a trace file with a header row")
    header = [h.strip() for h in next(csv.reader([first]))]
    if all(c in header for c in AZURE_COLUMNS):
        return "azure"
    if all(c in header for c in BURSTGPT_COLUMNS):
        return "burstgpt"
    if all(c in header for c in PLAIN_COLUMNS):
        return "plain"
    if first.lstrip().startswith("{"):
        return "mooncake"
    formats = {"a request CSV": PLAIN_COLUMNS, "an Azure CSV": AZURE_COLUMNS, "a BurstGPT CSV": BURSTGPT_COLUMNS}
    near, cols = max(formats.items(), key=lambda kv: sum(c in header for c in kv[1]))
    lacks = [c for c in cols if c not in header]
    what = (f"header {header} looks like {near} but lacks {lacks}" if len(lacks) < len(cols)
            else f"header {header} matches no known trace format")
    sep = next((name for ch, name in (("\t", "tabs"), (";", "semicolons"), ("|", "'|'")) if ch in first), None)
    if len(header) == 1 and sep:
        raise _err(path, 1, f"{what}: its fields are separated by {sep}, not commas",
                   "save it as a comma-separated CSV")
    lower = {h.lower() for h in header}
    cased = next((cs for cs in formats.values() if all(c.lower() in lower for c in cs)), None)
    if cased:
        raise _err(path, 1, f"{what}: column names are case-sensitive", f"name the columns exactly {list(cased)}")
    raise _err(path, 1, what, f"write a CSV with columns {list(PLAIN_COLUMNS)} (seconds, tokens, tokens), or use an "
               f"Azure CSV {list(AZURE_COLUMNS)}, a BurstGPT CSV {list(BURSTGPT_COLUMNS)} or a Mooncake JSONL with "
               f"{list(MOONCAKE_FIELDS)}")


def _loader(fmt: str) -> Callable[..., Trace]:
    """The format's loader, turning a file that is not UTF-8 text into a one-line TraceError."""
    fn = {"azure": load_azure, "mooncake": load_mooncake, "burstgpt": load_burstgpt, "plain": load_plain}[fmt]

    def load(path: str | Path, name: str | None = None) -> Trace:
        try:
            return fn(path, name=name)
        except UnicodeDecodeError as exc:
            raise _err(Path(path), 1, f"not UTF-8 text (byte {exc.object[exc.start:exc.start + 1]!r} at offset "
                       f"{exc.start})", "save the trace as UTF-8 (CSV or JSONL)") from None
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise _bad_gzip(Path(path), exc) from None

    return load


def _bad_gzip(path: Path, exc: BaseException) -> TraceError:
    return _err(path, 1, f"a damaged gzip file ({exc or type(exc).__name__})",
                "download it again, or decompress it (gzip -d) and pass the CSV or JSONL")


LOADERS = {"azure": load_azure, "mooncake": load_mooncake, "burstgpt": load_burstgpt}


def bundled_trace_path() -> Path:
    return BUNDLED_DIR / BUNDLED_FILE


def load_trace(name_or_path: str | Path, traces_dir: str | Path | None = None) -> Trace:
    """A named trace ("azure-conv", "azure-code", "mooncake", "burstgpt" from `traces_dir`, else the folder in
    $KERNEL_GYM_TRACES; "bundled", shipped in the package) or a trace file whose format is detected from its extension
    and header."""
    key = str(name_or_path)
    if key == "bundled":
        return load_azure(bundled_trace_path(), name="bundled-azure-conv-10min")
    if key in NAMED_TRACES:
        folder = traces_dir if traces_dir is not None else os.environ.get(TRACES_ENV) or None
        if folder is None:
            raise FileNotFoundError(
                f"trace {key!r} is read from the folder in {TRACES_ENV}, which is not set: download "
                f"{NAMED_TRACES[key]} (README: Data and licences) into a folder and set {TRACES_ENV} to it, or pass "
                "the file's path; or use 'bundled'"
            )
        path = Path(folder) / NAMED_TRACES[key]
        if not path.exists():
            raise FileNotFoundError(
                f"trace {key!r} needs {path.resolve()}, which is absent: download {NAMED_TRACES[key]} (README: Data "
                f"and licences), then set KERNEL_GYM_TRACES to its folder or pass the file's path; or use 'bundled'"
            )
        return _loader(_detect(path))(path, name=key)
    path = Path(key)
    if not path.exists():
        raise FileNotFoundError(
            f"trace {key!r} is neither a known name {sorted([*NAMED_TRACES, 'bundled'])} nor an existing file"
        )
    if not path.is_file():
        raise TraceError(f"--trace {key}: a directory, not a trace file; pass a CSV or JSONL file inside it, or a "
                         f"name {sorted([*NAMED_TRACES, 'bundled'])}")
    return _loader(_detect(path))(path)


# other archives a log is shipped in (magic bytes -> name, the command that unpacks it): read only through gzip
OTHER_ARCHIVES = ((b"BZh", "bzip2", "bunzip2 -k"), (b"\xfd7zXZ\x00", "xz", "unxz -k"),
                  (b"\x28\xb5\x2f\xfd", "zstd", "zstd -d"), (b"PK\x03\x04", "zip", "unzip"))


def _detect(path: Path) -> str:
    with open(path, "rb") as fh:
        magic = fh.read(6)
    for head, kind, unpack in OTHER_ARCHIVES:
        if magic.startswith(head):  # else "not UTF-8 text (offset 13)", which names no fix that works
            raise _err(path, 1, f"the file is compressed with {kind}; kernel_gym reads plain or gzip-compressed "
                       "CSV / JSONL only",
                       f"unpack it ({unpack} {path.name}) and pass the CSV or JSONL inside, or compress it with gzip")
    try:
        return detect_format(path)
    except UnicodeDecodeError as exc:
        raise _err(path, 1, f"not UTF-8 text (offset {exc.start})", "save the trace as UTF-8 (CSV or JSONL)") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise _bad_gzip(path, exc) from None
