"""`kernel-gym cycle`: the re-optimisation cycle a deployment runs (daily, or as a CI/CD step): read the period's own
traffic, decide whether the engine's fused-MoE config files are still right for it, re-plan what moved, confirm,
and hand the pipeline a safe change with an exit code.

    kernel-gym cycle --model mixtral-8x7b --engine vllm --current deploy/moe --traffic scrapes/ --traffic experts.pt

1. Profile (traffic/metrics.py): the period's M distribution (tokens per engine step, the fused-MoE batch), prompt
   and output lengths, decode context, routing skew (from per-expert counts when given), from Prometheus scrapes,
   a request log or both; compared with `traffic_profile.json` stored beside the current files, else the one a
   "no change" cycle left in `--report-dir` for the same engine file (stored_profile; none: everything counts as
   moved). A key of the engine file "moved" when its share of the steps, the M mix inside its cell or the
   skew changed beyond the thresholds (`--share-move`, `--skew-move`).
2. Price: the engine's lookup (nearest key) over the profile's M distribution at its skew, with the fused-MoE times
   of vLLM's kernel design recorded on the H200 (the `vllm_fused_moe` rows; between measured M and skews the
   times are interpolated, and that part is reported as the share resting on estimates). Current vs re-planned:
   the expected gain on this traffic.
3. Re-plan only the moved keys: per key the measured config with the lowest time over the M values that key serves
   (its cell of the profile), kept only if it beats the current entry by `--min-gain` there. Without `--gpu` this is
   the zero-shot change, unconfirmed (exit 11). With `--gpu` (deploy/cycle_gpu.py) each changed key's candidates are
   timed on the GPU in vLLM's kernel design and the change is kept only if it beats the current entry again in a
   paired round (samples interleaved one by one); the others keep the current entry (exit 10 when any change is
   confirmed). A shape without recorded rows is refused on the CPU; with `--gpu` it is timed there and priced from
   those timings (gpu_prices), or reported unpriced.
4. Output: the new folder (a copy of the current one with the changed engine file, its sidecar
   `kernel_gym_export.json` and the new `traffic_profile.json`) written atomically: a temporary folder, every file
   fsynced, then renamed to `--out` (default `<current>.next`); `--install` then moves it into the current folder's
   place (the old one becomes `<current>.prev`), and `--rollback` puts `<current>.prev` back. A diff report
   (`cycle_report.md` + `.json`) goes to `--report-dir` and into the new folder; one MLflow run per cycle in the
   experiment `kernel-gym-cycle` (`--no-mlflow` to skip).

Exit codes: 0 no change needed, 10 change proposed and confirmed, 11 proposed but unconfirmed (no GPU), 2 error (one
line naming the problem and the fix).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from kernel_gym.kernels.space import Config
from kernel_gym.traffic.metrics import PROFILE_FILE, TrafficProfile, load_profile, read_traffic

NO_CHANGE, CONFIRMED, UNCONFIRMED = 0, 10, 11
DECISIONS = {NO_CHANGE: "no change needed", CONFIRMED: "change proposed and confirmed",
             UNCONFIRMED: "change proposed, unconfirmed"}
REPORT_MD, REPORT_JSON = "cycle_report.md", "cycle_report.json"
EXPERIMENT = "kernel-gym-cycle"
DEFAULT_DEVICE = "NVIDIA H200"
SHARE_MOVE = 0.02  # a key moved when its share of steps changed by more than this (absolute) and by half (relative)
SKEW_MOVE = 0.15  # ... or the routing skew by more than this
SKEW_TOLERANCE = 0.05  # a skew this close to a measured one is priced as measured there
CELL_MOVE = 0.5  # ... or the mean log2 M inside its cell by more than this
MIN_SHARE = 0.002  # keys serving less than this share of the steps are left alone
NOISE_MARGIN = 0.5  # a lead must exceed this x (spread of the current row + the candidate's): the export's rule


# ---- pricing on recorded vllm_fused_moe times ---------------------------------------------------------------------

class Pricer:
    """Time per call (ms) of a config at (M, skew) for one MoE shard shape, from recorded rows (module docstring).

    Exact at a measured (M, skew); between measured M log-log interpolation of the config's own times; where the
    config lacks a bracketing measurement its nearest measured time scaled by the best config's ratio; above the
    largest measured M linear in M; between measured skews log-linear; outside them the nearest. Everything but an
    exact hit is flagged estimated. Rows too noisy to rank (spread above the recorded backend's MAX_SPREAD) price
    their own config but never make it a candidate or the per-M best. required=False (the --gpu path): a shape
    without rows prices nothing (every time None) instead of refusing, so that the GPU's timings decide."""

    def __init__(self, shape: Any, device: str = DEFAULT_DEVICE, rows: Any = None, engine: str = "vllm",
                 required: bool = True) -> None:
        from kernel_gym.deploy import engine_export as ee
        from kernel_gym.kernels import vllm_tables

        if rows is None:
            from kernel_gym.measure.store import PACKAGED_SNAPSHOT

            rows = ee.measured_rows([PACKAGED_SNAPSHOT])
        from kernel_gym.measure.recorded import MAX_SPREAD

        self.shape = shape
        # the rows of the launch path the engine runs at each M (vLLM 0.33+ skips the alignment at small M)
        self.times, self.spreads = ee.times_by_workload(rows, shape, device, vllm_tables.parse_engine(engine).id)
        # a row whose samples spread more than the recorded backend's MAX_SPREAD cannot rank configs (host delays in
        # the timed interval inflate it, docs/measurement.md): it still prices its own config (an upper bound), but
        # never makes a config a candidate or the per-M best
        self.max_spread = MAX_SPREAD
        if not self.times and required:
            raise ValueError(f"no recorded vllm_fused_moe times for E={shape.num_experts}, N={shape.n}, "
                             f"H={shape.hidden}, top_k={shape.top_k} on {device}: measure the shape (python3 "
                             "benchmarks/vllm_export/run.py, or kernel-gym collect --kernels vllm_fused_moe) and "
                             "pass --store, or run the cycle with --gpu")
        self.skews = sorted({s for _, s in self.times})
        self.ms = {s: sorted(m for m, s2 in self.times if s2 == s) for s in self.skews}
        self._memo: dict[tuple, tuple[float | None, bool]] = {}

    def clean(self, m: int, s: float, cfg: Config) -> bool:
        return cfg in self.times.get((m, s), {}) and self.spreads[(m, s)].get(cfg, 0.0) <= self.max_spread

    def _best_key(self, m: int, s: float) -> float:
        cell = self.times[(m, s)]
        clean = [t for c, t in cell.items() if self.clean(m, s, c)]
        return min(clean or cell.values())

    def _best_at(self, m: float, s: float) -> float:
        ms = self.ms[s]
        if m >= ms[-1]:
            return self._best_key(ms[-1], s) * m / ms[-1]
        if m <= ms[0]:
            return self._best_key(ms[0], s)
        k0 = max(k for k in ms if k <= m)
        k1 = min(k for k in ms if k >= m)
        if k0 == k1:
            return self._best_key(k0, s)
        f = (math.log(m) - math.log(k0)) / (math.log(k1) - math.log(k0))
        return math.exp((1 - f) * math.log(self._best_key(k0, s)) + f * math.log(self._best_key(k1, s)))

    def _at_skew(self, cfg: Config, m: int, s: float) -> tuple[float | None, bool]:
        ms = self.ms[s]
        exact = self.times.get((m, s), {}).get(cfg)
        if exact is not None:
            return exact, False
        if m > ms[-1]:
            t, _ = self._at_skew(cfg, ms[-1], s)
            return (t * m / ms[-1] if t else None), True
        if m < ms[0] and cfg in self.times[(ms[0], s)]:
            return self.times[(ms[0], s)][cfg], True  # below the grid: launch-bound, as at the smallest measured M
        k0 = max((k for k in ms if k <= m), default=ms[0])
        k1 = min((k for k in ms if k >= m), default=ms[-1])
        t0, t1 = self.times[(k0, s)].get(cfg), self.times[(k1, s)].get(cfg)
        if t0 and t1 and k1 > k0:
            f = (math.log(m) - math.log(k0)) / (math.log(k1) - math.log(k0))
            return math.exp((1 - f) * math.log(t0) + f * math.log(t1)), True
        have = [k for k in ms if cfg in self.times[(k, s)]]
        if not have:
            return None, True
        k = min(have, key=lambda k: (abs(math.log(k) - math.log(max(m, 1))), k))
        return self.times[(k, s)][cfg] * self._best_at(m, s) / self._best_key(k, s), True

    def time(self, cfg: Config, m: int, skew: float) -> tuple[float | None, bool]:
        """(ms or None when never measured at this shape and skew range, estimated?)."""
        key = (cfg, m, round(skew, 3))
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        sk = self.skews
        if not sk:
            return None, True
        if skew <= sk[0] + 1e-6 or skew >= sk[-1] - 1e-6 or len(sk) == 1:
            s = sk[0] if skew <= sk[0] + 1e-6 or len(sk) == 1 else sk[-1]
            t, est = self._at_skew(cfg, m, s)
            out = (t, est or abs(skew - s) > SKEW_TOLERANCE)
        else:
            s0 = max(s for s in sk if s <= skew)
            s1 = min(s for s in sk if s >= skew)
            a, _ = self._at_skew(cfg, m, s0)
            b, _ = self._at_skew(cfg, m, s1)
            if a and b:
                f = (skew - s0) / (s1 - s0)
                out = (math.exp((1 - f) * math.log(a) + f * math.log(b)), True)
            else:
                out = ((a or b), True)
        self._memo[key] = out
        return out

    def configs(self) -> list[Config]:
        return sorted({c for cell in self.times.values() for c in cell}, key=str)

    def candidates(self, key: int, skew: float) -> list[Config]:
        """The configs measured at this M key on the measured skews nearest to `skew`."""
        near = sorted(self.skews, key=lambda s: abs(s - skew))[:2]
        out = set()
        for s in near:
            m = key if (key, s) in self.times else min(
                self.ms[s], key=lambda k: abs(math.log(k) - math.log(max(key, 1))))
            out |= {c for c in self.times[(m, s)] if self.clean(m, s, c)}
        return sorted(out, key=str)

    def spread(self, key: int, skew: float, cfg: Config) -> float:
        s = min(self.skews, key=lambda s: abs(s - skew))
        return self.spreads.get((key, s), {}).get(cfg, 0.0)

    def _ranks_at(self, cfg: Config, m: int, skew: float) -> bool:
        """Whether the config's rows around (M, skew) are clean enough to rank it there."""
        for s in sorted(self.skews, key=lambda s: abs(s - skew))[:2]:
            ms = self.ms[s]
            around = {max((k for k in ms if k <= m), default=ms[0]), min((k for k in ms if k >= m), default=ms[-1])}
            if not all(self.clean(k, s, cfg) for k in around):
                return False
        return True

    def oracle(self, m: int, skew: float) -> tuple[float, bool]:
        """The fastest config at (M, skew) among those whose rows can rank it there: the per-M best, an upper
        bound no file with fixed keys beats."""
        key = ("oracle", m, round(skew, 3))
        if key in self._memo:
            return self._memo[key]  # type: ignore[return-value]
        best, est = math.inf, True
        for c in self.configs():
            if not self._ranks_at(c, m, skew):
                continue
            t, e = self.time(c, m, skew)
            if t is not None and t < best:
                best, est = t, e
        self._memo[key] = (best, est)
        return best, est


def nearest_key(keys: Sequence[int], m: int) -> int:
    """vLLM's and SGLang's rule: the key nearest to M (ties: the smaller key)."""
    return min(keys, key=lambda k: (abs(k - m), k))


def price(table: dict[int, Config], weights: dict[int, float], skew: float, pricer: Pricer) -> dict[str, Any]:
    """Mean fused-MoE time per call over the profile's steps when the engine serves `table` by nearest key, the
    share of it resting on estimated times, and the M values whose entry has no time."""
    keys = sorted(table)
    total = est = 0.0
    unpriced = []
    for m, w in weights.items():
        t, e = pricer.time(table[nearest_key(keys, m)], m, skew)
        if t is None:
            unpriced.append(m)
            continue
        total += w * t
        est += w * t if e else 0.0
    return {"ms": total, "estimated_share": est / total if total > 0 else 0.0, "unpriced_m": unpriced}


def priced_weights(tables: Sequence[dict[int, Config]], weights: dict[int, float], skew: float,
                   pricer: Pricer) -> tuple[dict[int, float], float]:
    """The profile restricted to the M values every table can price (so that prices compare the same steps), and
    the share of steps left out (entries never measured at this shape, e.g. a small-batch path's own rows)."""
    keep = {}
    for m, w in weights.items():
        if all(pricer.time(t[nearest_key(sorted(t), m)], m, skew)[0] is not None for t in tables):
            keep[m] = w
    left_out = sum(weights.values()) - sum(keep.values())
    return keep, left_out


def price_oracle(weights: dict[int, float], skew: float, pricer: Pricer,
                 tables: Sequence[dict[int, Config]] = ()) -> dict[str, Any]:
    """The per-M best over the profile; where one of `tables` prices faster at some M (its entry's row too noisy to
    rank, or off the grid), that time, so the bound stays below every compared file."""
    total = est = 0.0
    for m, w in weights.items():
        t, e = pricer.oracle(m, skew)
        for tab in tables:
            tt, te = pricer.time(tab[nearest_key(sorted(tab), m)], m, skew)
            if tt is not None and tt < t:
                t, e = tt, te
        if math.isfinite(t):
            total += w * t
            est += w * t if e else 0.0
    return {"ms": total, "estimated_share": est / total if total > 0 else 0.0}


# ---- comparing profiles and re-planning ---------------------------------------------------------------------------

@dataclass
class KeyPlan:
    key: int
    share: float
    share_before: float | None
    moved: bool
    why: str
    current: str
    proposed: str
    current_ms: float | None = None
    proposed_ms: float | None = None
    estimated: bool = True
    confirmed: bool | None = None
    confirm: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return self.proposed != self.current

    @property
    def gain(self) -> float | None:
        if self.current_ms and self.proposed_ms:
            return self.current_ms / self.proposed_ms
        return None


def cells(keys: Sequence[int], weights: dict[int, float]) -> dict[int, dict[int, float]]:
    """key -> {M: step share} of the M values the key serves."""
    out: dict[int, dict[int, float]] = {k: {} for k in keys}
    for m, w in weights.items():
        out[nearest_key(keys, m)][m] = w
    return out


def _mean_log(cell: dict[int, float]) -> float | None:
    tot = sum(cell.values())
    return sum(w * math.log2(m) for m, w in cell.items()) / tot if tot > 0 else None


def moved_keys(keys: Sequence[int], now: TrafficProfile, before: TrafficProfile | None, skew_now: float,
               skew_before: float | None, share_move: float = SHARE_MOVE,
               skew_move: float = SKEW_MOVE) -> dict[int, tuple[bool, str, float, float | None]]:
    """key -> (moved, why, share now, share before)."""
    c_now = cells(keys, now.m_weights)
    c_before = cells(keys, before.m_weights) if before else None
    out = {}
    skew_moved = skew_before is None or abs(skew_now - skew_before) > skew_move
    for k in keys:
        s_now = sum(c_now[k].values())
        s_before = sum(c_before[k].values()) if c_before is not None else None
        if s_now < MIN_SHARE:
            out[k] = (False, "no traffic", s_now, s_before)
        elif before is None:
            out[k] = (True, "no stored profile", s_now, s_before)
        elif skew_moved:
            out[k] = (True, f"skew {skew_before:.2f} -> {skew_now:.2f}" if skew_before is not None
                      else "skew unknown before", s_now, s_before)
        elif abs(s_now - s_before) > share_move and abs(s_now - s_before) > 0.5 * s_before:
            out[k] = (True, f"share {100 * s_before:.1f}% -> {100 * s_now:.1f}%", s_now, s_before)
        else:
            a, b = _mean_log(c_now[k]), _mean_log(c_before[k])
            if a is not None and b is not None and abs(a - b) > CELL_MOVE:
                out[k] = (True, f"mean M in cell {2 ** b:.0f} -> {2 ** a:.0f}", s_now, s_before)
            else:
                out[k] = (False, "unchanged", s_now, s_before)
    return out


def replan(table: dict[int, Config], now: TrafficProfile, before: TrafficProfile | None, skew: float,
           skew_before: float | None, pricer: Pricer, min_gain: float = 0.01, share_move: float = SHARE_MOVE,
           skew_move: float = SKEW_MOVE, noise_margin: float = NOISE_MARGIN) -> list[KeyPlan]:
    """The zero-shot re-plan of the moved keys (module docstring, step 3): a candidate must lead the current entry
    by min_gain and by noise_margin x the sum of the two rows' spreads."""
    keys = sorted(table)
    cell = cells(keys, now.m_weights)
    moved = moved_keys(keys, now, before, skew, skew_before, share_move, skew_move)
    plans = []
    for k in keys:
        is_moved, why, s_now, s_before = moved[k]
        cur = table[k]
        kp = KeyPlan(k, s_now, s_before, is_moved, why, str(cur), str(cur))
        if is_moved:
            def cost(c: Config, served: dict[int, float] = cell[k], s_now: float = s_now
                     ) -> tuple[float | None, bool]:
                tot, est = 0.0, False
                for m, w in served.items():
                    t, e = pricer.time(c, m, skew)
                    if t is None:
                        return None, True
                    tot += w * t
                    est |= e
                return tot / max(s_now, 1e-12), est
            cur_t, cur_e = cost(cur)
            kp.current_ms, kp.estimated = cur_t, cur_e
            if cur_t is not None:
                priced = [(t, str(c), c, e) for c in pricer.candidates(k, skew) for t, e in [cost(c)] if t is not None]
                if priced:
                    t, _, best, e = min(priced)
                    sp_cur, sp_best = pricer.spread(k, skew, cur), pricer.spread(k, skew, best)
                    # a current entry whose row is too noisy to rank has an upper-bound time: the lead is judged on
                    # the candidate's noise only, and the proposal says so (only --gpu can confirm it)
                    noisy_cur = sp_cur > pricer.max_spread
                    margin = max(min_gain, noise_margin * ((sp_best if noisy_cur else sp_cur) + sp_best))
                    if cur_t / t >= 1.0 + margin:
                        kp.proposed, kp.proposed_ms, kp.estimated = str(best), t, e or cur_e
                        if noisy_cur:
                            kp.why += "; the current entry's recorded time is too noisy to rank (an upper bound)"
                    else:
                        kp.proposed_ms = cur_t
            else:
                kp.why += "; the current entry has no recorded time at this shape (only --gpu can compare)"
        plans.append(kp)
    return plans


def gpu_ms(kp: KeyPlan) -> tuple[float | None, float | None]:
    """(current, kept entry) ms of a key from its GPU confirmation: the paired round's where there was one, else the
    current entry's sweep time (nothing else is kept without a paired round); (None, None) when nothing was timed."""
    res = kp.confirm or {}
    paired = res.get("paired")
    if paired:
        return paired["current_ms"], (paired["new_ms"] if kp.confirmed else paired["current_ms"])
    t = (res.get("timed") or {}).get(kp.current)
    return t, t


def gpu_prices(plans: Sequence[KeyPlan], weights: dict[int, float]) -> tuple[dict[str, Any], dict[str, Any], float]:
    """(current, re-planned, share of steps left out) where no recorded time prices the traffic (--gpu on an
    unmeasured shape): each timed key's steps at its entries' GPU times at the key's M (the steps at another M of
    its cell count as estimated); the steps of keys not timed are left out. Prices nothing rather than invent."""
    cell = cells(sorted(kp.key for kp in plans), weights)
    cur = new = est_cur = est_new = left = 0.0
    for kp in plans:
        share = sum(cell[kp.key].values())
        t_cur, t_new = gpu_ms(kp)
        if t_cur is None or t_new is None:
            left += share
            continue
        kp.current_ms, kp.proposed_ms = t_cur, t_new  # one source per report: this GPU's
        off = share - cell[kp.key].get(kp.key, 0.0)
        cur, new = cur + share * t_cur, new + share * t_new
        est_cur, est_new = est_cur + off * t_cur, est_new + off * t_new
    if cur <= 0:
        return {"ms": None, "estimated_share": None}, {"ms": None, "estimated_share": None}, sum(weights.values())
    return ({"ms": cur, "estimated_share": est_cur / cur}, {"ms": new, "estimated_share": est_new / new}, left)


def cycle_engine(engine: str, version: str, side_note: dict[str, Any]) -> tuple[Any, str]:
    """(the engine release the cycle prices for, where that came from). The release decides which launch path runs
    at each M (vLLM 0.33 and later skip the alignment at small M), so it picks the measured rows. --engine-version
    wins: after an engine upgrade the folder's files were exported for the old release, and the cycle re-plans them
    for the new one (said in the report). Without it, the release the sidecar says the file was exported for."""
    from kernel_gym.deploy.engine_export import SIDECAR as SIDECAR_NAME
    from kernel_gym.kernels import vllm_tables

    recorded = str(side_note.get("engine") or "")
    name = vllm_tables.split_engine_text(recorded)[0] if recorded else engine
    if name != engine:
        raise ValueError(f"--engine {engine}, but {SIDECAR_NAME} says the file was exported for {recorded}: pass "
                         f"--engine {name}, or export the file again for {engine}")
    if str(version).strip():
        eng = vllm_tables.parse_engine(vllm_tables.engine_with_version(engine, version))
        if recorded and recorded != eng.id:
            return eng, f"--engine-version; the file was exported for {recorded}"
        return eng, "--engine-version"
    if recorded:
        try:
            return vllm_tables.parse_engine(recorded), SIDECAR_NAME
        except ValueError as exc:
            raise ValueError(f"{SIDECAR_NAME} names {recorded}, which this kernel_gym has no tables of; pass "
                             f"--engine-version with the release that serves the folder now ({exc})") from None
    eng = vllm_tables.parse_engine(engine)
    return eng, f"not given, nor by {SIDECAR_NAME}: kernel_gym's default {eng.id} (pass --engine-version)"


# ---- the engine folder --------------------------------------------------------------------------------------------

def engine_file(folder: Path, engine: str, shape: Any, device: str) -> tuple[Path, str]:
    """(path of the current engine file, Triton version folder for SGLang or "")."""
    from kernel_gym.kernels import vllm_tables

    name = vllm_tables.config_file_name(shape.num_experts, shape.n, device, shape.dtype, engine=engine)
    if engine == "vllm":
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"--current {folder}: no vLLM config file {name} (E={shape.num_experts}, "
                                    f"N={shape.n}); write one first (kernel-gym export --format vllm --model ... "
                                    f"--tp ... --out {folder}) or check --model / --tp / --ep")
        return path, ""
    hits = sorted(folder.glob(f"configs/triton_*/{name}"))
    if not hits:
        raise FileNotFoundError(f"--current {folder}: no SGLang config file configs/triton_*/{name}; write one "
                                f"first (kernel-gym export --format sglang ... --out {folder}) or check --model / "
                                "--tp / --ep")
    path = hits[-1]
    return path, path.parent.name.removeprefix("triton_").replace("_", ".")


def read_table(path: Path) -> dict[int, Config]:
    from kernel_gym.kernels.vllm_moe import to_config

    try:
        data = json.loads(path.read_text())
        table = {int(k): to_config(v) for k, v in data.items() if k != "triton_version"}
    except (json.JSONDecodeError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{path}: not an engine fused-MoE config file ({type(exc).__name__}: {exc}); restore it "
                         "from the previous folder (kernel-gym cycle --rollback) or export it again") from None
    if not table:
        raise ValueError(f"{path}: no M keys; export the file again (kernel-gym export --format vllm|sglang)")
    return table


PROFILE_FOR = ("model", "engine", "tp", "ep", "device", "current_folder", "engine_file", "engine_file_sha256")
# The report folder's copy of the profile the files were last judged on, named apart from the traffic_profile.json a
# new folder carries: --report-dir may be the --current folder itself, where that name would pass for the live one.
REPORT_PROFILE_FILE = "cycle_traffic_profile.json"


def stored_profile(current: Path, report_dir: Path, made_for: dict[str, Any]) -> tuple[TrafficProfile | None, str]:
    """(the profile the current files were last judged on, where it came from): the current folder's (a cycle's new
    folder carries it), else the report folder's when the cycle that wrote it changed nothing on the same engine file
    (PROFILE_FOR: model, TP, EP, engine, device, path and content). A "no change" cycle writes nothing into --current,
    so its profile is kept in the report folder; a proposal's profile is not the live file's (it may never be put in
    place)."""
    here = current / PROFILE_FILE
    if here.exists():
        return load_profile(here), f"the current folder's ({here})"
    there = report_dir / REPORT_PROFILE_FILE
    try:
        last = json.loads((report_dir / REPORT_JSON).read_text())
    except (OSError, ValueError):
        return None, ""
    if (not there.exists() or not isinstance(last, dict) or last.get("exit_code") != NO_CHANGE
            or any(last.get(k) != made_for[k] for k in PROFILE_FOR)):
        return None, ""
    return load_profile(there), f"the report folder's ({there}; the last cycle there: no change, same engine file)"


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for f in files:
            fd = os.open(os.path.join(dirpath, f), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def check_out(current: Path, out: Path) -> None:
    """Refuse, before any work, an --out that would lose files: the live folder itself (the change would land
    unconfirmed, with no .prev to roll back to), or a folder a cycle did not write (its report is its mark: an earlier
    cycle's proposal is replaced, anything else is the user's)."""
    if out.resolve() == current.resolve():
        raise ValueError(f"--out {out} is the --current folder: a cycle writes its proposal beside the live files; "
                         "pass --install to move it into place (the current folder is kept as "
                         f"{prev_of(current).name} for --rollback)")
    if out.exists() and not (out.is_dir() and (out / REPORT_JSON).exists()):
        raise ValueError(f"--out {out} exists and is not a folder an earlier cycle wrote (no {REPORT_JSON} in it): "
                         "pass another --out, or move that one away first")


def write_folder(current: Path, out: Path, write: Any) -> Path:
    """Copy `current` to a temporary sibling of `out`, let `write(tmp)` change it, fsync everything, rename it to
    `out` (an existing `out` is replaced). A crash leaves either the old `out` or the new one, never a half."""
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(current, tmp, ignore=shutil.ignore_patterns(REPORT_MD, REPORT_JSON))
    write(tmp)
    _fsync_tree(tmp)
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def prev_of(current: Path) -> Path:
    return current.with_name(current.name + ".prev")


def install_folder(current: Path, new: Path) -> Path:
    """Move `new` into `current`'s place; the old folder becomes `<current>.prev` (an older .prev is dropped)."""
    prev = prev_of(current)
    if prev.exists():
        shutil.rmtree(prev)
    os.replace(current, prev)
    os.replace(new, current)
    return prev


def rollback(current: Path) -> Path:
    """Put `<current>.prev` back; the folder it replaces is kept as `<current>.undone`."""
    prev = prev_of(current)
    if not prev.is_dir():
        raise FileNotFoundError(f"--rollback: no previous folder {prev} (a cycle with --install keeps one); nothing "
                                "to restore")
    undone = current.with_name(current.name + ".undone")
    if undone.exists():
        shutil.rmtree(undone)
    if current.exists():
        os.replace(current, undone)
    os.replace(prev, current)
    return undone


# ---- the report ---------------------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def skew_range_note(skew: float, measured: Sequence[float] | None) -> str:
    """Said beside the skew when it lies outside the measured skews: the Pricer prices it at the nearest measured
    skew (counted as estimated), which a user reading 'skew 2.50' next to a price would not otherwise know."""
    if not measured or measured[0] - SKEW_TOLERANCE <= skew <= measured[1] + SKEW_TOLERANCE:
        return ""
    near = measured[0] if skew < measured[0] else measured[1]
    return (f"; **outside the measured skews ({measured[0]:.2f}-{measured[1]:.2f}): priced at {near:.2f}**, so the "
            "prices below are estimates there; `--gpu` times the candidates at this skew")


def price_lines(rep: dict[str, Any]) -> list[str]:
    """The report's prices and where they come from: recorded rows, this cycle's GPU timings (a shape the rows lack),
    or nothing (then it says so rather than print 0 ms)."""
    cur, new, left = rep["price_current"], rep["price_new"], _pct(rep["unpriced_step_share"])
    src = rep.get("price_source", "recorded")
    if src == "none":
        return ["- fused-MoE time per call on this traffic: **not priced**: no recorded vllm_fused_moe times at this "
                "shape and nothing timed on the GPU (each key's GPU result is in cycle_report.json)",
                f"- steps left out of the prices: {left}"]
    est = (f"; share resting on estimates {_pct(new['estimated_share'])} (current {_pct(cur['estimated_share'])})"
           + (" (steps at another M than their key's)" if src == "gpu" else ""))
    if src == "gpu":
        head = ("- priced fused-MoE time per call on this traffic **from this cycle's GPU timings** (no recorded "
                "times at this shape; each timed key's steps at its entries' times at the key's M, paired where a "
                f"change was tried): current {cur['ms']:.4f} ms, re-planned {new['ms']:.4f} ms")
        why = "keys not timed on the GPU"
    else:
        head = (f"- priced fused-MoE time per call on this traffic: current {cur['ms']:.4f} ms, re-planned "
                f"{new['ms']:.4f} ms, per-M best {rep['price_oracle']['ms']:.4f} ms")
        why = "an entry without any recorded time at this shape"
    return [head, f"- steps left out of the prices ({why}): {left}",
            f"- **expected gain x{rep['expected_gain']:.4f}**{est}"]


def report_md(rep: dict[str, Any]) -> str:
    p, b, src = rep["profile"], rep.get("profile_before"), rep.get("profile_before_source") or ""
    ep = f" EP {rep['ep']}" if rep.get("ep", 1) > 1 else ""
    lines = [f"# kernel-gym cycle: {rep['decision']} (exit {rep['exit_code']})", "",
             f"- model {rep['model']} TP {rep['tp']}{ep}, engine {rep['engine']} "
             f"{rep.get('engine_version', '')} ({rep.get('engine_version_source', '')}), file `{rep['engine_file']}`",
             f"- traffic: {', '.join(p['sources'])} ({p['m_source']}); {p['requests']:.0f} requests, "
             f"{p['steps']:.0f} steps" + (f" over {p['span_s']:.0f} s" if p.get("span_s") else ""),
             f"- stored profile: {'none (everything counts as moved)' if b is None else 'yes, ' + src}",
             f"- routing skew: now {rep['skew']:.2f} ({rep['skew_source']})"
             + (f", before {rep['skew_before']:.2f}" if rep.get("skew_before") is not None else "")
             + skew_range_note(rep["skew"], rep.get("skew_measured")),
             f"- prompt p50/p90: {p['prompt'].get('p50', float('nan')):.0f}/{p['prompt'].get('p90', float('nan')):.0f}"
             + (f" (before {b['prompt'].get('p50', float('nan')):.0f}/{b['prompt'].get('p90', float('nan')):.0f})"
                if b else "") + f"; decode context mean {p['decode'].get('context_mean', float('nan')):.0f}"
             + (f" (before {b['decode'].get('context_mean', float('nan')):.0f})" if b else ""),
             *price_lines(rep),
             f"- moved keys {rep['moved_keys']}, changed {rep['changed_keys']}"
             + (f", confirmed on the GPU {rep['confirmed_keys']}" if rep["gpu"] else
                " (zero-shot, no GPU: unconfirmed)" if rep["changed_keys"] else " (zero-shot, no GPU)"),
             f"- GPU-seconds this cycle: {rep['gpu_s']:.1f}", "",
             "| M key | steps now | before | moved | why | current ms | proposed ms | gain | changed | confirmed |",
             "|---:|---:|---:|---|---|---:|---:|---:|---|---|"]
    for k in rep["keys"]:
        if not k["moved"] and not k["share"]:
            continue
        g = (k["current_ms"] / k["proposed_ms"]) if k["current_ms"] and k["proposed_ms"] else None
        lines.append(f"| {k['key']} | {_pct(k['share'])} | {_pct(k['share_before'])} | {'yes' if k['moved'] else ''} "
                     f"| {k['why']} | {k['current_ms'] or float('nan'):.4f} | {k['proposed_ms'] or float('nan'):.4f} "
                     f"| {'' if g is None else f'x{g:.3f}'} | {'yes' if k['proposed'] != k['current'] else ''} | "
                     f"{'' if k['confirmed'] is None else ('yes' if k['confirmed'] else 'no')} |")
    lines += ["", "Changed entries:", ""]
    lines += [f"- M {k['key']}: {k['current']} -> {k['proposed']}" for k in rep["keys"]
              if k["proposed"] != k["current"]]
    return "\n".join(lines) + "\n"


def log_mlflow(rep: dict[str, Any], files: list[Path], tracking_uri: str | None) -> str:
    """One run per cycle: params, the decision and prices as metrics, the report and profile as artifacts."""
    import mlflow

    from kernel_gym.train import tracking

    uri = tracking.setup_tracking(tracking_uri)
    exp = tracking.get_or_create_experiment(EXPERIMENT, uri)
    with mlflow.start_run(experiment_id=exp, run_name=f"cycle {rep['model']} {rep['engine']}") as run:
        mlflow.log_params({"model": rep["model"], "engine": rep["engine"], "tp": rep["tp"], "ep": rep["ep"],
                           "engine_version": rep.get("engine_version", ""),
                           "gpu": rep["gpu"], "price_source": rep["price_source"], "current": rep["current"],
                           "traffic": ",".join(rep["profile"]["sources"])[:500],
                           "engine_file": rep["engine_file"]})
        mlflow.set_tags({"decision": rep["decision"], "git_commit": tracking.git_commit()})
        values = {"exit_code": rep["exit_code"], "expected_gain": rep["expected_gain"],
                  "estimated_share": rep["price_new"]["estimated_share"],
                  "moved_keys": rep["moved_keys"], "changed_keys": rep["changed_keys"],
                  "confirmed_keys": rep["confirmed_keys"], "skew": rep["skew"], "gpu_s": rep["gpu_s"],
                  "price_current_ms": rep["price_current"]["ms"], "price_new_ms": rep["price_new"]["ms"],
                  "price_oracle_ms": rep["price_oracle"]["ms"], "requests": rep["profile"]["requests"]}
        mlflow.log_metrics({k: v for k, v in values.items() if v is not None})  # an unpriced cycle logs no price
        for f in files:
            if f.exists():
                mlflow.log_artifact(str(f))
        return run.info.run_id


def run_cycle(*, current: Path, model: str | None = None, engine: str | None = None,
              traffic: Sequence[str | Path] = (), tp: int = 1, ep: int = 1, device: str = DEFAULT_DEVICE,
              gpu: bool = False, gpu_budget_s: float = 300.0, top_k: int = 4, out: Path | None = None,
              install: bool = False,
              report_dir: Path = Path("."), stores: Sequence[str | Path] = (), min_gain: float = 0.01,
              noise_margin: float = NOISE_MARGIN, share_move: float = SHARE_MOVE, skew_move: float = SKEW_MOVE,
              no_mlflow: bool = False, tracking_uri: str = "", rows: Any = None,
              confirmer: Any = None, engine_version: str = "") -> tuple[int, dict[str, Any]]:
    """One cycle on the engine files in `current` (module docstring); returns (exit code, report). `ep` is the
    expert-parallel degree (export's --ep: the file is named by the local expert count). `engine_version`: the
    release that serves the folder now (default: the one its sidecar was exported for, else kernel_gym's default;
    `cycle_engine`). `rows` replaces the measured rows (default: `stores`, else the packaged dataset) and
    `confirmer` the GPU's (tests)."""
    from kernel_gym.deploy import engine_export as ee
    from kernel_gym.models import load_model

    if not model or not engine:
        raise ValueError("--model and --engine are required (except with --rollback)")
    if not current.is_dir():
        raise FileNotFoundError(f"--current {current}: no such folder; pass the folder the engine reads its "
                                "configs from (VLLM_TUNED_CONFIG_FOLDER / SGLANG_MOE_CONFIG_DIR)")
    if min_gain < 0:
        raise ValueError(f"--min-gain must be >= 0, got {min_gain}")
    check_out(current, out or current.with_name(current.name + ".next"))
    spec = load_model(model)
    shape = ee.shard_shape(spec, tp, ep=ep)
    path, triton_version = engine_file(current, engine, shape, device)
    table = read_table(path)
    sim_model, sim_memory = spec, None
    if tp > 1 or ep > 1:  # the request log / SGLang rate replayed on one GPU of the layout, its KV pool the layout's
        from kernel_gym.parallel.layout import Layout, attention_spec, pool_memory_bytes

        layout = Layout(tp, ep)
        sim_model, sim_memory = attention_spec(spec, layout), pool_memory_bytes(spec, layout)
    profile = read_traffic(list(traffic), spec, engine, sim_model, sim_memory)
    made_for = {"model": spec.name, "engine": engine, "tp": tp, "ep": ep, "device": device,
                "current_folder": str(current.resolve()),
                "engine_file": str(path.relative_to(current)),
                "engine_file_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    before, before_source = stored_profile(current, report_dir, made_for)
    side = current / ee.SIDECAR
    side_note = {}
    if side.exists():
        try:
            side_note = json.loads(side.read_text()).get("files", {}).get(str(path.relative_to(current)), {})
        except (json.JSONDecodeError, AttributeError):
            side_note = {}
    eng, engine_version_source = cycle_engine(engine, engine_version, side_note)
    skew_before = before.skew if before and before.skew is not None else side_note.get("skew")
    if profile.skew is not None:
        skew, skew_source = profile.skew, "per-expert counts"
    elif skew_before is not None:
        skew = float(skew_before)
        skew_source = "none given: the stored " + ("profile's" if before and before.skew is not None else "sidecar's")
        profile.routing = dict(before.routing) if before and before.routing else {"skew": skew}
        profile.estimated.append("routing skew not observed this period (kept the stored one)")
    else:
        skew, skew_source = 0.0, "none given: uniform assumed"
        profile.estimated.append("routing skew not observed: uniform assumed")
    if rows is None and stores:
        rows = ee.measured_rows(stores)
    if rows is None:
        from kernel_gym.measure.store import PACKAGED_SNAPSHOT

        rows = ee.measured_rows([PACKAGED_SNAPSHOT])
    pricer = Pricer(shape, device, rows, eng.id, required=not gpu)  # --gpu times a shape the rows lack
    plans = replan(table, profile, before, skew, skew_before, pricer, min_gain, share_move, skew_move,
                   noise_margin)
    gpu_s = 0.0
    if gpu:
        if confirmer is None:
            from kernel_gym.deploy.cycle_gpu import GpuConfirmer

            confirmer = GpuConfirmer(shape, budget_s=gpu_budget_s, engine=eng.id, rows=rows,
                                     keys=sum(kp.moved for kp in plans))
        if hasattr(confirmer, "keys_left"):  # the budget is shared out over the moved keys
            confirmer.keys_left = max(1, sum(kp.moved for kp in plans))
        for kp in plans:
            if not kp.moved:
                continue
            cands = [c for c in pricer.candidates(kp.key, skew) if str(c) != kp.current]
            if not pricer.times:  # an unmeasured shape: the nearest measured shapes' winners at --device
                from kernel_gym.deploy import engine_tune as et

                near = et.nearest_shapes(rows, shape, device)
                cands = [c for c in et.nearest_winners(rows, shape, kp.key, skew, device, near) if str(c) != kp.current]
            ranked = sorted(cands, key=lambda c: pricer.time(c, kp.key, skew)[0] or math.inf)[: top_k]
            res = confirmer.tune_key(kp.key, skew, Config.parse(kp.current), ranked, min_gain)
            kp.confirm = res
            if res.get("confirmed"):
                kp.proposed, kp.confirmed = res["config"], True
            else:
                kp.proposed, kp.confirmed = kp.current, False if kp.changed or res.get("timed") else None
        gpu_s = float(getattr(confirmer, "gpu_s", 0.0))
    new_table = {kp.key: Config.parse(kp.proposed) for kp in plans}
    common, unpriced = priced_weights([table, new_table], profile.m_weights, skew, pricer)
    if not common and not gpu:  # "no change" would claim a comparison that was never made
        degrees = (f" --tp {tp}" if tp > 1 else "") + (f" --ep {ep}" if ep > 1 else "")
        raise ValueError(f"{path.name}: none of the traffic's batch sizes can be priced from the measured rows at "
                         f"this shape (E={shape.num_experts}, N={shape.n}, {device}): the CPU cannot decide; pass "
                         "--gpu to time the candidates on this GPU, or measure the shape first (kernel-gym tune "
                         f"--engine {eng.id} --model {model}{degrees} on a GPU)")
    if common or not gpu:
        price_source = "recorded"
        p_cur = price(table, common, skew, pricer)
        p_new = price(new_table, common, skew, pricer)
        p_orc = price_oracle(common, skew, pricer, [table, new_table])
    else:  # nothing recorded prices these steps: this cycle's GPU timings do, or nothing does (never a made-up 0 ms)
        p_cur, p_new, unpriced = gpu_prices(plans, profile.m_weights)
        price_source = "gpu" if p_cur["ms"] is not None else "none"
        p_orc = {"ms": None, "estimated_share": None}
    changed = [kp for kp in plans if kp.changed]
    code = NO_CHANGE if not changed else (CONFIRMED if gpu and all(kp.confirmed for kp in changed)
                                          else UNCONFIRMED)
    rep = {
        "decision": DECISIONS[code], "exit_code": code, **made_for, "current": str(current),
        "engine_version": eng.version, "engine_version_source": engine_version_source,
        "gpu": bool(gpu), "gpu_s": gpu_s, "skew": skew, "skew_source": skew_source,
        "skew_before": skew_before, "skew_measured": [pricer.skews[0], pricer.skews[-1]] if pricer.skews else None,
        "profile": profile.to_json(),
        "profile_before": before.to_json() if before else None, "profile_before_source": before_source or None,
        "price_source": price_source, "price_current": p_cur, "price_new": p_new, "price_oracle": p_orc,
        "expected_gain": None if p_new["ms"] is None else (p_cur["ms"] / p_new["ms"] if p_new["ms"] > 0 else 1.0),
        "unpriced_step_share": unpriced,
        "moved_keys": sum(kp.moved for kp in plans), "changed_keys": len(changed),
        "confirmed_keys": sum(bool(kp.confirmed) for kp in changed),
        "keys": [asdict(kp) for kp in plans], "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    report_dir.mkdir(parents=True, exist_ok=True)
    md, js = report_md(rep), json.dumps(rep, indent=1, default=str) + "\n"
    new_folder = None
    if changed:
        folder = out or current.with_name(current.name + ".next")
        rel = path.relative_to(current)

        def write(tmp: Path) -> None:
            from kernel_gym.kernels.vllm_moe import to_entry

            content = {str(k): to_entry(c) for k, c in sorted(new_table.items())}
            note = {**{k: v for k, v in side_note.items() if k != "keys"}, "model": spec.name, "tp": tp,
                    "engine": eng.id, "engine_name": eng.name, "engine_version": eng.version,
                    "shape": shape.__dict__, "device": device, "routing": f"skew {skew:.2f}", "skew": skew,
                    "estimate": code != CONFIRMED, "cycle": {
                        "decision": rep["decision"], "created": rep["created"], "expected_gain": rep["expected_gain"],
                        "estimated_share": p_new["estimated_share"], "from": str(current)},
                    "keys": [{"M": kp.key, "changed": kp.changed, "moved": kp.moved, "confirmed": kp.confirmed,
                              "gain": kp.gain} for kp in plans]}
            target = ee.write_engine_file(tmp, engine, shape, device, content, triton_version or "unknown",
                                          note)
            if target.relative_to(tmp) != rel:  # SGLang: keep the folder of the Triton version it runs
                target.rename(tmp / rel)
            profile.save(tmp / PROFILE_FILE)
            (tmp / REPORT_MD).write_text(md)
            (tmp / REPORT_JSON).write_text(js)

        new_folder = write_folder(current, folder, write)
        rep["new_folder"] = str(new_folder)
        if install:
            rep["previous_folder"] = str(install_folder(current.resolve(), new_folder))
            rep["installed"] = str(current)
        js = json.dumps(rep, indent=1, default=str) + "\n"
    # the next cycle's stored profile after a "no change": the one the files were judged on. Where no key moved and
    # a baseline was found, that baseline stays, so that drift below the thresholds each period still adds up
    kept = before if before is not None and not rep["moved_keys"] else profile
    prof_path = kept.save(report_dir / REPORT_PROFILE_FILE)
    (report_dir / REPORT_MD).write_text(md)
    (report_dir / REPORT_JSON).write_text(js)  # last: it vouches for the profile beside it (stored_profile)
    if not no_mlflow:
        rep["mlflow_run_id"] = log_mlflow(rep, [report_dir / REPORT_MD, report_dir / REPORT_JSON, prof_path],
                                          tracking_uri or None)
    return code, rep


def summary_lines(code: int, rep: dict[str, Any], report_dir: Path) -> list[str]:
    """What `kernel-gym cycle` prints after a cycle: the priced change, the new folder, the decision."""
    src = rep.get("price_source", "recorded")
    by = " from this cycle's GPU timings" if src == "gpu" else ""
    priced = ("not priced (no recorded times at this shape, nothing timed on the GPU)" if src == "none" else
              f"priced fused-MoE time{by} current "
              f"{rep['price_current']['ms']:.4f} ms -> {rep['price_new']['ms']:.4f} ms: expected gain "
              f"x{rep['expected_gain']:.4f}, {_pct(rep['price_new']['estimated_share'])} of it on estimated times")
    version = f" {rep['engine_version']}" if rep.get("engine_version") else ""
    lines = [f"[cycle] {rep['model']} {rep['engine']}{version} {rep['engine_file']}: {rep['moved_keys']} keys moved, "
             f"{rep['changed_keys']} changed; {priced}"]
    if "exported for" in rep.get("engine_version_source", ""):
        lines.append(f"[cycle] priced for {rep['engine']}{version} ({rep['engine_version_source']})")
    beyond = skew_range_note(rep["skew"], rep.get("skew_measured"))
    if beyond:
        lines.append(f"[cycle] routing skew {rep['skew']:.2f}{beyond.replace('**', '')}")
    if rep.get("new_folder"):
        where = f" installed at {rep['installed']} (previous: {rep['previous_folder']})" if rep.get("installed") else ""
        lines.append(f"[cycle] new folder {rep['new_folder']}{where}")
    lines.append(f"[cycle] {rep['decision']} (exit {code}); report {report_dir / REPORT_MD}")
    if code == UNCONFIRMED and not rep.get("installed"):
        lines.append("[cycle] next: confirm the change on the serving GPU (the same command with --gpu), or put it in "
                     "place as it is with --install (--rollback undoes it)")
    return lines
