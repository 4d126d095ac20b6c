"""What a deployment records, read into a traffic profile: the input of `kernel-gym cycle` (deploy/cycle.py).

Sources (any mix; `read_traffic` detects each from its content):
- Prometheus text-format scrapes of the engine's `/metrics` (one file, or a folder of scrapes taken over the period:
  counters and histograms are cumulative since the server started, so a folder's period is the delta between its
  first and last scrape, a counter reset between two scrapes (a restart) adding the later scrape whole).
  vLLM: `vllm:iteration_tokens_total` (tokens per engine step: the fused-MoE M of every step),
  `vllm:request_prompt_tokens` and `vllm:request_generation_tokens` (per-request lengths),
  `vllm:num_requests_running` / `_waiting` (gauges).
  SGLang: `sglang:prompt_tokens_histogram` / `sglang:generation_tokens_histogram` (needs `--collect-tokens-histogram`),
  `sglang:num_running_reqs` / `sglang:num_queue_reqs`. SGLang exports no per-step token count, so its M distribution
  is rebuilt by the serving simulator from the request lengths and rate (the profile says so).
- A request log in any trace format the project reads (traces.py: Azure, Mooncake, BurstGPT): replayed through the
  serving simulator (config-blind roofline kernel times) for the per-step M, decode batch and context.
- Per-expert token counts, for the routing skew: SGLang's expert distribution recorder (`stat` mode dump
  `expert_distribution_recorder_*.pt`, a dict with `logical_count` [steps, layers, experts]; older releases' CSV
  `layer_id,expert_id,count`), vLLM's EPLB state (a JSON or .pt holding `expert_load_window` [window, layers,
  physical experts] or `total_load`, with `physical_to_logical_map`, or per-layer `logical_load` lists as vLLM's
  examples/offline_inference/explore_eplb.py gathers them), or a plain JSON {"counts": [[...per expert...] per layer]}.

Every bad or partial input raises `MetricsError` naming the file and the fix. Imports numpy and the standard library
(torch only to open a .pt dump).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from kernel_gym.traffic.traces import is_gzip, plain_suffix

PROFILE_FILE = "traffic_profile.json"
PROFILE_FORMAT = "kernel-gym-traffic-profile/1"
VLLM_STEP_TOKENS = "vllm:iteration_tokens_total"
VLLM_PROMPT = "vllm:request_prompt_tokens"
VLLM_GENERATION = "vllm:request_generation_tokens"
VLLM_RUNNING = "vllm:num_requests_running"
VLLM_WAITING = "vllm:num_requests_waiting"
SGLANG_PROMPT = "sglang:prompt_tokens_histogram"
SGLANG_GENERATION = "sglang:generation_tokens_histogram"
SGLANG_RUNNING = "sglang:num_running_reqs"
SGLANG_WAITING = "sglang:num_queue_reqs"
# vLLM V1's buckets for iteration_tokens_total without CUDA-graph sizes (vllm/v1/metrics/loggers.py)
VLLM_STEP_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class MetricsError(ValueError):
    """A metrics / expert-count file that cannot be read as is; the message names the file and the fix."""


def _err(path: Any, what: str, fix: str, line: int | None = None) -> MetricsError:
    where = f"{path}:{line}" if line is not None else str(path)
    return MetricsError(f"{where}: {what}; fix: {fix}")


# ---- the Prometheus text format --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float
    timestamp_ms: float | None = None


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_ESC = {"\\": "\\", '"': '"', "n": "\n"}


def _float(text: str) -> float:
    t = text.strip()
    if t in ("+Inf", "Inf", "inf", "+inf"):
        return math.inf
    if t in ("-Inf", "-inf"):
        return -math.inf
    return float(t)  # NaN parses too


def _labels(text: str, i: int, path: Any, line: int) -> tuple[tuple[tuple[str, str], ...], int]:
    """Parse `{a="x",b="y"}` from text[i] == '{'; returns (labels, index after '}')."""
    out, i = [], i + 1
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if i < len(text) and text[i] == "}":
            return tuple(out), i + 1
        m = _NAME.match(text, i)
        if not m or m.end() >= len(text) or text[m.end()] != "=" or text[m.end() + 1:m.end() + 2] != '"':
            raise _err(path, "malformed label set", "give name=\"value\" pairs inside {...}", line)
        key, i, val = m.group(), m.end() + 2, []
        while i < len(text) and text[i] != '"':
            if text[i] == "\\" and i + 1 < len(text):
                val.append(_ESC.get(text[i + 1], text[i + 1]))
                i += 2
            else:
                val.append(text[i])
                i += 1
        if i >= len(text):
            raise _err(path, "unterminated label value", "close the quote", line)
        out.append((key, "".join(val)))
        i += 1


def parse_prometheus(text: str, path: Any = "<text>") -> list[Sample]:
    """Samples of a Prometheus text-format exposition (comments and # HELP / # TYPE lines skipped)."""
    out = []
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _NAME.match(line)
        if not m:
            raise _err(path, f"not a metric line: {line[:60]!r}", "give the engine's /metrics text as scraped", line_no)
        name, i = m.group(), m.end()
        labels: tuple[tuple[str, str], ...] = ()
        if i < len(line) and line[i] == "{":
            labels, i = _labels(line, i, path, line_no)
        parts = line[i:].split()
        if not parts or len(parts) > 2:
            raise _err(path, f"metric {name} has no value (or extra fields)", "give 'name{labels} value [ts]'",
                       line_no)
        try:
            value = _float(parts[0])
            ts = float(parts[1]) if len(parts) == 2 else None
        except ValueError:
            raise _err(path, f"metric {name} value {parts[0]!r} is not a number", "correct that line",
                       line_no) from None
        out.append(Sample(name, labels, value, ts))
    return out


@dataclass
class Histogram:
    """A cumulative Prometheus histogram summed over its series: upper bounds (+inf last), cumulative counts, sum."""

    bounds: list[float]
    cumulative: list[float]
    total: float

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def counts(self) -> list[float]:
        """Per-bucket counts (not cumulative)."""
        return [c - (self.cumulative[i - 1] if i else 0.0) for i, c in enumerate(self.cumulative)]

    def minus(self, earlier: Histogram) -> Histogram:
        """This scrape's counts since `earlier`; a reset (any count went down) means the server restarted: all of
        this scrape counts."""
        if earlier.bounds != self.bounds:
            return self
        if any(a < b - 1e-9 for a, b in zip(self.cumulative, earlier.cumulative)) or self.total < earlier.total - 1e-9:
            return self
        return Histogram(list(self.bounds), [a - b for a, b in zip(self.cumulative, earlier.cumulative)],
                         self.total - earlier.total)

    def plus(self, other: Histogram) -> Histogram:
        if other.bounds != self.bounds:
            raise ValueError("histograms with different buckets cannot be added")
        return Histogram(list(self.bounds), [a + b for a, b in zip(self.cumulative, other.cumulative)],
                         self.total + other.total)

    def quantile(self, q: float) -> float:
        """Linear within a bucket (Prometheus' histogram_quantile rule); the +Inf bucket answers its lower bound."""
        n = self.count
        if n <= 0:
            return float("nan")
        rank, lo, prev = q * n, 0.0, 0.0
        for b, c in zip(self.bounds, self.cumulative):
            if c >= rank:
                if math.isinf(b):
                    return lo
                return lo + (b - lo) * ((rank - prev) / max(c - prev, 1e-12))
            lo, prev = b, c
        return lo


def histogram(samples: Iterable[Sample], family: str) -> Histogram | None:
    """The family's histogram summed over its series (e.g. DP engines), or None when the scrape lacks it."""
    buckets: dict[float, float] = {}
    total, seen = 0.0, False
    for s in samples:
        if s.name == family + "_bucket":
            le = dict(s.labels).get("le")
            if le is None:
                continue
            b = _float(le)
            buckets[b] = buckets.get(b, 0.0) + s.value
            seen = True
        elif s.name == family + "_sum":
            total += s.value
    if not seen:
        return None
    bounds = sorted(buckets)
    if not math.isinf(bounds[-1]):
        bounds.append(math.inf)
        buckets[math.inf] = buckets[bounds[-2]]
    return Histogram(bounds, [buckets[b] for b in bounds], total)


def gauge(samples: Iterable[Sample], name: str) -> float | None:
    """The gauge summed over its series, or None."""
    vals = [s.value for s in samples if s.name == name and math.isfinite(s.value)]
    return float(sum(vals)) if vals else None


# ---- scrapes over a period ----------------------------------------------------------------------------------------

@dataclass
class Scrape:
    path: str
    time_s: float
    samples: list[Sample]

    @property
    def engine(self) -> str | None:
        names = {s.name.split(":", 1)[0] for s in self.samples if ":" in s.name}
        for e in ("vllm", "sglang"):
            if e in names:
                return e
        return None


def read_scrape(path: str | Path) -> Scrape:
    """One scrape file; its time is the samples' own timestamp when they carry one, else the file's mtime."""
    path = Path(path)
    try:
        text = _head(path, None).decode("utf-8")
    except UnicodeDecodeError:
        raise _err(path, "not UTF-8 text", "save the /metrics response as text (curl -s URL/metrics > FILE)") from None
    samples = parse_prometheus(text, path)
    if not samples:
        raise _err(path, "no samples", "scrape the engine's /metrics endpoint (curl -s http://HOST:PORT/metrics)")
    stamps = [s.timestamp_ms for s in samples if s.timestamp_ms is not None]
    t = max(stamps) / 1000.0 if stamps else path.stat().st_mtime
    sc = Scrape(str(path), t, samples)
    if sc.engine is None:
        raise _err(path, "no vllm: or sglang: metrics in the scrape",
                   "scrape the serving engine's own /metrics (vLLM or SGLang), not a proxy's")
    return sc


@dataclass
class Period:
    """What the scrapes say about the period: histograms of its events, gauge samples, its span."""

    engine: str
    files: list[str]
    span_s: float | None  # None: one scrape (counts since the server started)
    histograms: dict[str, Histogram]
    gauges: dict[str, list[float]]


def period_from_scrapes(scrapes: list[Scrape]) -> Period:
    """Deltas between consecutive scrapes (time order), summed; gauges sampled at every scrape."""
    if not scrapes:
        raise MetricsError("no scrapes given; fix: pass a scrape file or a folder of them")
    scrapes = sorted(scrapes, key=lambda s: (s.time_s, s.path))
    engines = {s.engine for s in scrapes}
    if len(engines) > 1:
        raise _err(scrapes[0].path, f"scrapes of different engines {sorted(engines)}",
                   "give one engine's scrapes per --traffic")
    engine = scrapes[0].engine
    fams = ((VLLM_STEP_TOKENS, VLLM_PROMPT, VLLM_GENERATION) if engine == "vllm"
            else (SGLANG_PROMPT, SGLANG_GENERATION))
    gnames = (VLLM_RUNNING, VLLM_WAITING) if engine == "vllm" else (SGLANG_RUNNING, SGLANG_WAITING)
    hists: dict[str, Histogram] = {}
    for fam in fams:
        hs = [histogram(s.samples, fam) for s in scrapes]
        if any(h is None for h in hs):
            continue
        if len(hs) == 1:
            hists[fam] = hs[0]
            continue
        acc = None
        for a, b in zip(hs, hs[1:]):
            d = b.minus(a)
            acc = d if acc is None else acc.plus(d)
        hists[fam] = acc
    gauges = {g: [v for v in (gauge(s.samples, g) for s in scrapes) if v is not None] for g in gnames}
    span = scrapes[-1].time_s - scrapes[0].time_s if len(scrapes) > 1 else None
    return Period(engine, [s.path for s in scrapes], span, hists, gauges)


# ---- expert counts ------------------------------------------------------------------------------------------------

def _as_array(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def _logical(load: np.ndarray, p2l: Any, path: Any) -> np.ndarray:
    """[layers, physical] -> [layers, logical] through physical_to_logical_map (replicas of one expert added)."""
    if p2l is None:
        return load
    m = _as_array(p2l).astype(np.int64)
    if m.shape != load.shape:
        raise _err(path, f"physical_to_logical_map has shape {m.shape}, the loads {load.shape}",
                   "dump the map and the loads of the same EPLB state")
    out = np.zeros((load.shape[0], int(m.max()) + 1))
    for layer in range(load.shape[0]):
        np.add.at(out[layer], m[layer], load[layer])
    return out


def _from_mapping(data: dict, path: Any) -> np.ndarray:
    if "logical_count" in data:  # SGLang stat dump: [buffered steps, layers, logical experts]
        x = _as_array(data["logical_count"])
        return x.sum(axis=0) if x.ndim == 3 else x
    p2l = data.get("physical_to_logical_map")
    if "expert_load_window" in data:  # vLLM EPLB: [window, layers, physical experts]
        x = _as_array(data["expert_load_window"])
        return _logical(x.sum(axis=0) if x.ndim == 3 else x, p2l, path)
    if "total_load" in data:
        return _logical(_as_array(data["total_load"]), p2l, path)
    if "per_layer_stats" in data:
        rows = data["per_layer_stats"]
        key = "logical_load" if rows and "logical_load" in rows[0] else "physical_load"
        x = np.array([r[key] for r in rows], dtype=np.float64)
        return x if key == "logical_load" else _logical(x, p2l, path)
    if "counts" in data:
        return _as_array(data["counts"])
    raise _err(path, f"no expert counts among keys {sorted(data)[:8]}",
               "give SGLang's expert distribution dump (logical_count), vLLM's EPLB expert_load_window / total_load "
               "with physical_to_logical_map, or {\"counts\": [[...] per layer]}")


def read_expert_counts(path: str | Path) -> np.ndarray:
    """[layers, experts] token counts over the period, from any of the formats in the module docstring."""
    path = Path(path)
    if path.suffix == ".pt":
        import torch

        try:
            data = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a corrupt or foreign pickle
            raise _err(path, f"torch.load failed ({type(exc).__name__})",
                       "give the .pt file SGLang's /dump_expert_distribution_record wrote") from None
        if not isinstance(data, dict):
            raise _err(path, "the .pt holds no dict", "give SGLang's expert distribution dump (stat mode)")
        x = _from_mapping(data, path)
    elif plain_suffix(path) == ".csv":
        with io.StringIO(_head(path, None).decode("utf-8"), newline="") as fh:
            reader = csv.DictReader(fh)
            need = {"layer_id", "expert_id", "count"}
            if not reader.fieldnames or not need <= set(reader.fieldnames):
                raise _err(path, f"header {reader.fieldnames} lacks {sorted(need)}",
                           "give SGLang's expert distribution CSV (layer_id,expert_id,count)", 1)
            cells: dict[tuple[int, int], float] = {}
            for n, row in enumerate(reader, start=2):
                try:
                    cells[(int(row["layer_id"]), int(row["expert_id"]))] = float(row["count"])
                except (TypeError, ValueError):
                    raise _err(path, f"row {row} is not integers", "correct or delete that row", n) from None
        if not cells:
            raise _err(path, "no rows", "record some traffic before dumping the expert distribution")
        layers = max(k[0] for k in cells) + 1
        experts = max(k[1] for k in cells) + 1
        x = np.zeros((layers, experts))
        for (la, ex), c in cells.items():
            x[la, ex] += c
    else:
        try:
            data = json.loads(_head(path, None).decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _err(path, f"not JSON ({exc})", "give a JSON, CSV or .pt expert-count file") from None
        if not isinstance(data, dict):
            raise _err(path, "not a JSON object", "give {\"counts\": [[...] per layer]} or an EPLB state dump")
        x = _from_mapping(data, path)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] < 2 or not np.all(np.isfinite(x)) or np.any(x < 0):
        raise _err(path, f"expert counts of shape {x.shape} are not [layers, >= 2 experts] of counts >= 0",
                   "give per-layer, per-expert token counts")
    if x.sum() <= 0:
        raise _err(path, "every expert count is 0", "record traffic before dumping the counts")
    return x


def routing_skew(counts: np.ndarray, top_k: int) -> dict[str, float]:
    """Effective Zipf skew (MoEWorkload.skew) per layer, token-weighted mean and spread over layers."""
    from kernel_gym.traffic.routing import effective_skew, max_share

    rows = [r for r in counts if r.sum() > 0]
    skews = np.array([effective_skew(r, min(top_k, len(r))) for r in rows])
    w = np.array([r.sum() for r in rows])
    return {"skew": float(np.average(skews, weights=w)), "skew_min": float(skews.min()),
            "skew_max": float(skews.max()), "max_share": float(np.mean([max_share(r) for r in rows])),
            "layers": float(len(rows)), "experts": float(counts.shape[1])}


# ---- the profile --------------------------------------------------------------------------------------------------

def m_grid_point(m: float) -> int:
    """M on the simulator's memo grid (exact to 16, then 2^(k/4)): the profile's M bins."""
    from kernel_gym.traffic.simulator import round_count

    return round_count(max(1, int(round(m))))


@dataclass
class TrafficProfile:
    """The period's traffic, per kernel: M (tokens per step, the fused-MoE batch) as step weights on the M grid;
    decode batch and context; prompt and output lengths (quantiles); the routing skew. `estimated` lists what was
    rebuilt rather than read (e.g. the M distribution from the simulator)."""

    engine: str
    sources: list[str]
    span_s: float | None
    requests: float
    steps: float
    m_weights: dict[int, float]  # M -> share of steps (sums to 1)
    prompt: dict[str, float]
    output: dict[str, float]
    decode: dict[str, float] = field(default_factory=dict)
    routing: dict[str, float] = field(default_factory=dict)
    running: dict[str, float] = field(default_factory=dict)
    estimated: list[str] = field(default_factory=list)
    m_source: str = ""

    @property
    def skew(self) -> float | None:
        return self.routing.get("skew")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["m_weights"] = {str(k): v for k, v in sorted(self.m_weights.items())}
        return {"format": PROFILE_FORMAT, **d}

    @classmethod
    def from_json(cls, data: dict[str, Any], path: Any = "<profile>") -> TrafficProfile:
        if data.get("format") != PROFILE_FORMAT:
            raise _err(path, f"format {data.get('format')!r} is not {PROFILE_FORMAT}",
                       "give a traffic_profile.json written by kernel-gym cycle")
        d = {k: v for k, v in data.items() if k != "format"}
        d["m_weights"] = {int(k): float(v) for k, v in d["m_weights"].items()}
        return cls(**d)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path


def load_profile(path: str | Path) -> TrafficProfile:
    path = Path(path)
    try:
        return TrafficProfile.from_json(json.loads(path.read_text()), path)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise _err(path, f"unreadable traffic profile ({exc})", "delete it: the cycle then treats all traffic as "
                   "moved") from None


def _quantiles(values: np.ndarray | None = None, hist: Histogram | None = None) -> dict[str, float]:
    if values is not None and len(values):
        return {"mean": float(np.mean(values)), "p50": float(np.percentile(values, 50)),
                "p90": float(np.percentile(values, 90)), "p99": float(np.percentile(values, 99)),
                "count": float(len(values))}
    if hist is not None and hist.count > 0:
        return {"mean": hist.total / hist.count, "p50": hist.quantile(0.5), "p90": hist.quantile(0.9),
                "p99": hist.quantile(0.99), "count": hist.count}
    return {}


def m_weights_from_steps(num_tokens: np.ndarray) -> dict[int, float]:
    """Step shares per M grid point of an array of tokens per step (steps with 0 tokens dropped)."""
    x = np.asarray(num_tokens)
    x = x[x > 0]
    if not len(x):
        return {}
    out: dict[int, float] = {}
    for m, c in zip(*np.unique(x.astype(np.int64), return_counts=True)):
        g = m_grid_point(m)
        out[g] = out.get(g, 0.0) + float(c)
    total = sum(out.values())
    return {k: v / total for k, v in sorted(out.items())}


def m_weights_from_histogram(h: Histogram) -> dict[int, float]:
    """Step shares per M grid point from a tokens-per-step histogram: each bucket (lo, hi] spread over the grid
    points inside it, log-uniformly (the histogram does not say where in the bucket the steps fell); the +Inf
    bucket at the mean its share of the sum implies."""
    counts = h.counts()
    known = sum(c * math.sqrt(max(lo, 1.0) * b) for lo, b, c in
                zip([0.0, *h.bounds[:-1]], h.bounds, counts) if not math.isinf(b))
    out: dict[int, float] = {}
    lo = 0.0
    for b, c in zip(h.bounds, counts):
        if c > 0:
            if math.isinf(b):
                mean = max((h.total - known) / c, lo + 1) if h.total > known else 2 * max(lo, 1)
                pts = [m_grid_point(mean)]
            else:
                pts = sorted({m_grid_point(v) for v in np.geomspace(max(lo + 1, 1), b, 24)} |
                             ({int(b)} if b <= 16 else set()))
                pts = [p for p in pts if lo < p <= b] or [m_grid_point(b)]
            for p in pts:
                out[p] = out.get(p, 0.0) + c / len(pts)
        lo = b
    total = sum(out.values())
    if total <= 0:
        return {}
    return {k: v / total for k, v in sorted(out.items())}


def sample_histogram(h: Histogram, rng: np.random.Generator) -> np.ndarray:
    """Values drawn bucket by bucket (log-uniform inside a bucket), as many as the histogram counts (rounded)."""
    counts = np.round(h.counts()).astype(int)
    lo, out = 0.0, []
    for b, c in zip(h.bounds, counts):
        if c > 0:
            hi = b if not math.isinf(b) else max(2 * max(lo, 1.0), 2.0)
            a = max(lo, 1.0)
            out.append(np.exp(rng.uniform(math.log(a), math.log(max(hi, a + 1e-9)), size=c)))
        lo = b
    return np.maximum(1, np.round(np.concatenate(out))).astype(np.int64) if out else np.zeros(0, np.int64)


# ---- simulated step statistics (request logs and SGLang) -----------------------------------------------------------

class _BlindChooser:
    """Config-blind chooser for the profile simulation: the kernel times do not depend on it (RooflineTimer)."""

    def __init__(self) -> None:
        from kernel_gym.kernels.space import Config

        self._any = Config({})
        self._decode: dict[Any, Any] = {}

    def choose(self, kernel: str, workload: Any, kv: Any) -> Any:
        from kernel_gym.kernels.profiles import follows_kv

        if not follows_kv(kernel):
            return self._any
        from kernel_gym.kernels.space import Config

        c = self._decode.get(kv)
        if c is None:
            c = self._decode[kv] = Config({"PAGE_SIZE": kv.page_size, "LAYOUT": kv.layout})
        return c


ROOFLINE_EFFICIENCY = 0.5  # the profile simulation's kernel times: roofline / 0.5 (a typical tuned kernel's share)


def simulate_steps(model: Any, trace: Any, routing: Any = None, max_requests: int = 20000,
                   gpu_memory_bytes: float | None = None) -> dict[str, Any]:
    """Per-step statistics of a request log replayed through the serving simulator with config-blind roofline
    kernel times: M per step, decode batch and mean context. `model` is what one GPU runs (a tensor-parallel shard
    with `gpu_memory_bytes` sizing its KV pool as the whole deployment's: parallel.layout.pool_memory_bytes)."""
    from kernel_gym.measure.roofline import RooflineTimer
    from kernel_gym.traffic.simulator import Simulator

    if len(trace) > max_requests:
        trace = trace.head(max_requests)
    memory = {} if gpu_memory_bytes is None else {"gpu_memory_bytes": gpu_memory_bytes}
    sim = Simulator(model, trace, RooflineTimer(ROOFLINE_EFFICIENCY), _BlindChooser(), routing,
                    compile_s=lambda k, c: 0.0, **memory)
    res = sim.run()
    tokens = res.step_column("num_tokens")
    batch = res.step_column("decode_batch")
    ctx = res.step_column("mean_context")
    dec = batch > 0
    return {"num_tokens": tokens, "decode_batch": batch[dec], "mean_context": ctx[dec],
            "running": res.step_column("running"), "span_s": res.summary["sim_time_s"]}


def profile_from_trace(trace: Any, model: Any, engine: str = "", routing: Any = None,
                       source: str = "", gpu_memory_bytes: float | None = None) -> TrafficProfile:
    st = simulate_steps(model, trace, routing, gpu_memory_bytes=gpu_memory_bytes)
    return TrafficProfile(
        engine=engine, sources=[source or getattr(trace, "source", "") or trace.name], span_s=float(trace.duration_s),
        requests=float(len(trace)), steps=float(len(st["num_tokens"])),
        m_weights=m_weights_from_steps(st["num_tokens"]),
        prompt=_quantiles(trace.prompt_tokens), output=_quantiles(trace.output_tokens),
        decode={"batch_mean": float(np.mean(st["decode_batch"])) if len(st["decode_batch"]) else 0.0,
                "context_mean": float(np.mean(st["mean_context"])) if len(st["mean_context"]) else 0.0,
                "context_p90": float(np.percentile(st["mean_context"], 90)) if len(st["mean_context"]) else 0.0},
        running={"mean": float(np.mean(st["running"])) if len(st["running"]) else 0.0},
        estimated=["M and decode statistics from the serving simulator (roofline kernel times)"],
        m_source="simulator (request log)")


def profile_from_period(p: Period, model: Any, seed: int = 0, gpu_memory_bytes: float | None = None) -> TrafficProfile:
    """The profile of a period of scrapes: vLLM's step-token histogram read directly; SGLang's (none exported)
    rebuilt by replaying requests drawn from its length histograms at the observed rate."""
    first = p.files[0]
    prompt_h = p.histograms.get(VLLM_PROMPT if p.engine == "vllm" else SGLANG_PROMPT)
    gen_h = p.histograms.get(VLLM_GENERATION if p.engine == "vllm" else SGLANG_GENERATION)
    run_name = VLLM_RUNNING if p.engine == "vllm" else SGLANG_RUNNING
    running = p.gauges.get(run_name, [])
    estimated: list[str] = []
    decode: dict[str, float] = {}
    if p.engine == "vllm":
        steps_h = p.histograms.get(VLLM_STEP_TOKENS)
        if steps_h is None:
            raise _err(first, f"the scrape has no {VLLM_STEP_TOKENS} histogram (tokens per engine step)",
                       "scrape a vLLM V1 server (>= 0.8) with metrics on (the default); the cycle needs the "
                       "per-step token counts")
        if steps_h.count <= 0:
            raise _err(first, f"{VLLM_STEP_TOKENS} counted no steps in the period",
                       "scrape over a period in which the server served traffic")
        m_weights, steps, m_source = m_weights_from_histogram(steps_h), steps_h.count, VLLM_STEP_TOKENS
        estimated.append("M inside each iteration_tokens bucket (spread log-uniformly over the bucket)")
        requests = prompt_h.count if prompt_h else 0.0
    else:
        if prompt_h is None or gen_h is None:
            raise _err(first, f"the scrape lacks {SGLANG_PROMPT} / {SGLANG_GENERATION}",
                       "start SGLang with --enable-metrics --collect-tokens-histogram")
        if p.span_s is None or p.span_s <= 0:
            raise _err(first, "one SGLang scrape has no period (SGLang exports no per-step token counts, so the "
                       "cycle rebuilds them from the request rate)", "give a folder of >= 2 scrapes over the period")
        rng = np.random.default_rng(seed)
        prompts, outs = sample_histogram(prompt_h, rng), sample_histogram(gen_h, rng)
        n = min(len(prompts), len(outs))
        if n == 0:
            raise _err(first, "no requests in the period", "scrape over a period in which the server served traffic")
        from kernel_gym.traffic.traces import Trace

        arrivals = np.sort(rng.uniform(0.0, p.span_s, size=n))
        trace = Trace("sglang-period", arrivals - arrivals[0], rng.permutation(prompts[:n]), outs[:n], first)
        st = simulate_steps(model, trace, gpu_memory_bytes=gpu_memory_bytes)
        m_weights, steps = m_weights_from_steps(st["num_tokens"]), float(len(st["num_tokens"]))
        m_source = "simulator (SGLang request-length histograms and rate)"
        estimated.append("M from the simulator: SGLang exports no per-step token counts; requests drawn from its "
                         "prompt/generation histograms, arrivals uniform over the period")
        decode = {"batch_mean": float(np.mean(st["decode_batch"])) if len(st["decode_batch"]) else 0.0,
                  "context_mean": float(np.mean(st["mean_context"])) if len(st["mean_context"]) else 0.0}
        requests = float(n)
    if prompt_h is not None and gen_h is not None and prompt_h.count > 0 and not decode:
        mp, mg = prompt_h.total / prompt_h.count, gen_h.total / max(gen_h.count, 1)
        decode = {"context_mean": mp + mg / 2}
        estimated.append("decode context = mean prompt + half the mean output")
    return TrafficProfile(
        engine=p.engine, sources=list(p.files), span_s=p.span_s, requests=float(requests), steps=float(steps),
        m_weights=m_weights, prompt=_quantiles(hist=prompt_h), output=_quantiles(hist=gen_h), decode=decode,
        running={"mean": float(np.mean(running)), "samples": float(len(running))} if running else {},
        estimated=estimated, m_source=m_source)


# ---- one entry point ----------------------------------------------------------------------------------------------

def _head(path: Path, size: int | None = 4096) -> bytes:
    """The file's first `size` bytes (all: None), through gzip when it is gzip-compressed (rotated scrapes are)."""
    import gzip
    import zlib

    try:
        with (gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")) as fh:
            return fh.read() if size is None else fh.read(size)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise _err(path, f"a damaged gzip file ({exc})", "decompress it (gzip -d) or take that scrape again") from None


def classify(path: Path) -> str:
    """'scrapes' | 'experts' | 'trace' for one file; a folder is 'scrapes' (or 'experts' when it holds only them)."""
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.is_file() and not f.name.startswith("."))
        if not files:
            raise _err(path, "empty folder", "put the period's scrapes (curl .../metrics > t0.txt, t1.txt ...) or "
                       "expert counts in it, or leave it out of --traffic (without counts the stored skew is kept)")
        kinds = {classify(f) for f in files}
        if kinds == {"scrapes"}:
            return "scrapes"
        if kinds == {"experts"}:
            return "experts"
        if kinds == {"trace"}:
            raise _err(path, f"a folder of {len(files)} file(s) that are not Prometheus scrapes (request logs or "
                       "unreadable files: a folder is read as a period's scrapes)",
                       "pass one request log file, or a folder holding only /metrics scrapes")
        raise _err(path, f"folder mixes {sorted(kinds)}", "pass scrapes, expert counts and request logs separately")
    if path.suffix == ".pt":
        return "experts"
    head = _head(path).decode("utf-8", errors="replace")
    first = next((ln.strip() for ln in head.splitlines() if ln.strip()), "")
    if first.startswith("#") or re.match(r"^(vllm|sglang):", first):
        return "scrapes"
    if first.replace(" ", "").startswith("layer_id,expert_id"):
        return "experts"
    if plain_suffix(path) == ".json" and first.startswith("{"):  # one JSON object, not JSON lines: counts
        return "experts"
    return "trace"


def read_traffic(sources: list[str | Path], model: Any, engine: str | None = None, sim_model: Any = None,
                 sim_memory_bytes: float | None = None) -> TrafficProfile:
    """One profile from the given sources: scrapes (file or folder) or a request log for the traffic, optionally
    expert counts for the skew. Without expert counts the skew is absent (the cycle keeps the stored one). Where the
    steps are simulated, `sim_model` / `sim_memory_bytes` are one GPU of the deployment (default: the whole model on
    one GPU)."""
    from kernel_gym.traffic.traces import load_trace

    if not sources:
        raise MetricsError("no --traffic given; fix: pass a scrape, a folder of scrapes, a request log, and "
                           "optionally per-expert counts")
    traffic: list[tuple[str, Path]] = []
    experts: list[Path] = []
    for s in sources:
        path = Path(s)
        if not path.exists():
            raise _err(path, "no such file or folder", "pass an existing scrape, folder, request log or counts file")
        kind = classify(path)
        if kind == "experts":
            experts.extend(sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else [path])
        else:
            traffic.append((kind, path))
    if len(traffic) != 1:
        raise MetricsError(f"{len(traffic)} traffic sources ({', '.join(str(p) for _, p in traffic) or 'none'}); "
                           "fix: give exactly one scrape / folder of scrapes / request log, plus any expert counts")
    kind, path = traffic[0]
    if kind == "scrapes":
        files = sorted(f for f in path.iterdir() if f.is_file()) if path.is_dir() else [path]
        period = period_from_scrapes([read_scrape(f) for f in files])
        if engine and period.engine != engine:
            raise _err(path, f"the scrapes are {period.engine} metrics, --engine is {engine}",
                       f"pass --engine {period.engine} or the {engine} server's scrapes")
        prof = profile_from_period(period, sim_model or model, gpu_memory_bytes=sim_memory_bytes)
    else:
        prof = profile_from_trace(load_trace(path), sim_model or model, engine or "", source=str(path),
                                  gpu_memory_bytes=sim_memory_bytes)
    if experts:
        arrays = [read_expert_counts(f) for f in experts]
        if len({a.shape for a in arrays}) != 1:
            raise _err(experts[0], "expert-count files of different shapes", "give one model's counts")
        counts = np.sum(arrays, axis=0)
        if model.num_experts < counts.shape[1] <= 2 * model.num_experts:  # EPLB's redundant slots (a few per GPU)
            raise _err(experts[0], f"counts for {counts.shape[1]} experts, {model.name} has {model.num_experts}: "
                       f"these look like per physical expert slots ({counts.shape[1] - model.num_experts} redundant "
                       "replicas of an EPLB deployment)", "dump physical_to_logical_map with the loads (vLLM's EPLB "
                       "state holds it) so that replicas are added back to their expert, or give per-expert "
                       "(logical) counts; or check that --model names the served model")
        if counts.shape[1] != model.num_experts:
            raise _err(experts[0], f"counts for {counts.shape[1]} experts, {model.name} has {model.num_experts}",
                       "give the counts of the model --model names")
        prof.routing = routing_skew(counts, model.top_k)
        prof.sources += [str(f) for f in experts]
    if not prof.engine:
        prof.engine = engine or ""
    return prof


def write_atomic(path: Path, text: str) -> None:
    """Write a file through a temporary one in the same folder, fsynced, then renamed over the target."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
