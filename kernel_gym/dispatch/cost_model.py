"""A learned cost model for fused MoE configs, to re-rank zero-shot candidates at shapes far from training.

Why: the model-conditioned policy answers with one argmax over ~30 catalogue entries; far from its training shapes
that argmax is often a poor tile (design leave-half-out: geomean 0.919, worst 0.41). A cost model in the TVM/Ansor
style instead scores every candidate (the policy's top 8, the catalogue, the nearest measured shapes' winners, the
engine's own entry) from features that are RELATIVE to the shape (tokens per expert, row blocks per BLOCK_M, tiles
per dimension, waves per SM, padding shares), which transfer between shapes where absolute sizes do not.

Target: log(median_ms), fitted with a free offset per workload (the loss is the within-workload variance of the
error, i.e. the mean squared error over all pairs of configs of one workload). Only the order of configs within one
workload matters for a choice; the absolute level depends on the whole shape, which the features deliberately do not
pin down, and a target relative to "the best time at that workload" would depend on how many configs happened to be
measured there (30 at a zoo shape, 1,848 at a built-in model's). Times more than CAP (e^1.5 = 4.5x) above the
workload's best are clipped to it: how bad a bad config is does not matter, only that it loses. Every workload
weighs the same, however many configs it holds.

Model: an MLP (2 x 64, tanh) in numpy, Adam, full workloads per minibatch; deterministic for a seed; saved as plain
arrays (`fused_moe.cost.npz`) with a JSON beside it (feature list, dataset hash, fit settings) so that it ships beside
a policy bundle (train/bundle.py) and loads without pickle.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from kernel_gym.kernels.space import SHARED_MEMORY_LIMIT, Config

KERNEL = "fused_moe"
NUM_SMS = 132  # H200 (the packaged dataset's device)
CAP = 1.5  # log-time above the workload's best beyond which a config is just "slow"
FILE_STEM = "fused_moe.cost"  # bundle files: fused_moe.cost.npz + fused_moe.cost.json
FORMAT = 1

FEATURES: tuple[str, ...] = (
    # the workload (constant within one workload: they only shape how the config features combine)
    "log2_tokens", "skew", "log2_experts", "log2_top_k", "log2_hidden", "log2_intermediate", "log2_tokens_per_expert",
    # the config's knobs
    "log2_block_m", "log2_block_n", "log2_block_k", "log2_warps", "stages", "group_m8", "log2_split_k", "tma1",
    "tma2", "fuse_silu", "fuse_weight", "fuse_sum",
    # shape relative to the tiles
    "log2_slots_per_block_m", "log2_tokens_per_expert_per_block_m", "log2_row_blocks", "row_fill",
    "log2_n_gate_up_tiles", "n_gate_up_fill", "log2_k_gate_up_steps", "k_gate_up_fill",
    "log2_n_down_tiles", "n_down_fill", "log2_k_down_steps", "k_down_fill",
    "log2_waves_gate_up", "wave_fill_gate_up", "log2_waves_down", "wave_fill_down",
    "smem_share", "acc_per_thread",
)


def _log2(x: float) -> float:
    return math.log2(max(float(x), 1e-9))


def _fill(n: int, tile: int) -> float:
    """Share of a tiled dimension that is real work (1 = no padding)."""
    return n / (math.ceil(n / tile) * tile)


def _waves(programs: float) -> tuple[float, float]:
    """(log2 waves over the SMs, share of the last wave's SMs busy averaged over all waves)."""
    waves = programs / NUM_SMS
    return _log2(waves), programs / (max(1, math.ceil(waves)) * NUM_SMS)


@functools.lru_cache(maxsize=1 << 16)  # feature_matrix asks it again for every config of a workload
def expected_row_blocks(workload: Any, block_m: int) -> float:
    """Expected BLOCK_M row blocks after each non-empty expert's slots are padded to BLOCK_M (fused_moe
    align_block_size): expert e gets about M * top_k * p_e slots (Zipf popularity p, at most M), and is non-empty with
    probability 1 - exp(-slots)."""
    m = workload.num_tokens
    lam = np.minimum(m, m * workload.top_k * np.asarray(workload.expert_popularity(), dtype=np.float64))
    blocks = (1.0 - np.exp(-lam)) * np.maximum(1.0, np.ceil(lam / block_m))
    return float(max(1.0, blocks.sum()))


def features(workload: Any, config: Mapping[str, Any]) -> np.ndarray:
    """The FEATURES vector of one (workload, config): sizes only as logs, the config against the shape as counts of
    tiles, steps and waves and as the share of each that is padding."""
    m, e, k, h, n = workload.num_tokens, workload.num_experts, workload.top_k, workload.hidden, workload.intermediate
    bm, bn, bk = int(config["BLOCK_M"]), int(config["BLOCK_N"]), int(config["BLOCK_K"])
    warps, stages, split = int(config["num_warps"]), int(config["num_stages"]), int(config.get("SPLIT_K", 1))
    silu, tma = int(config["FUSE_SILU"]), int(config.get("TMA_LOADS", 0))
    slots = m * k
    blocks = expected_row_blocks(workload, bm)
    n_gu = n if silu else 2 * n
    per_stage = max(bm * bk + (2 if silu else 1) * bn * bk, bm * bk + bn * bk) * (4 if workload.dtype == "float32"
                                                                                  else 2)
    wg, fg = _waves(blocks * math.ceil(n_gu / bn))
    wd, fd = _waves(blocks * math.ceil(h / bn) * split)
    k_down = math.ceil(n / split)
    values = (
        _log2(m), float(workload.skew), _log2(e), _log2(k), _log2(h), _log2(n), _log2(slots / e),
        _log2(bm), _log2(bn), _log2(bk), _log2(warps), float(stages), float(int(config["GROUP_M"]) > 1),
        _log2(split), float(tma == 1), float(tma == 2), float(silu), float(config["FUSE_WEIGHT"]),
        float(config["FUSE_SUM"]),
        _log2(slots / bm), _log2(slots / e / bm), _log2(blocks), slots / (blocks * bm),
        _log2(n_gu / bn), _fill(n_gu, bn), _log2(math.ceil(h / bk)), _fill(h, bk),
        _log2(h / bn), _fill(h, bn), _log2(math.ceil(k_down / bk)), _fill(k_down, bk),
        wg, fg, wd, fd,
        stages * per_stage / SHARED_MEMORY_LIMIT, bm * bn * (2 if silu else 1) / (32 * warps) / 128.0,
    )
    return np.asarray(values, dtype=np.float64)


def feature_matrix(workload: Any, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
    return np.stack([features(workload, c) for c in configs]) if configs else np.zeros((0, len(FEATURES)))


# ---- data ------------------------------------------------------------------------------------------------------------


def shape_of(workload: Any) -> tuple:
    """The shape a workload belongs to (everything but the batch and the routing skew): the unit of held-out splits."""
    return (workload.num_experts, workload.top_k, workload.hidden, workload.intermediate, workload.dtype)


@dataclass
class Group:
    """One workload's ok rows: its configs, their feature rows and log median times."""

    workload: Any
    configs: list[Config]
    x: np.ndarray
    y: np.ndarray


def training_groups(backend: Any, exclude_shapes: Iterable[tuple] = (), exclude_keys: Iterable[str] = (),
                    min_configs: int = 2) -> list[Group]:
    """The fused_moe workloads of a backend (recorded: the packaged dataset) with their ok, timed, valid configs, minus
    every workload of an excluded shape (held-out evaluation) or key; sorted by key, so a fit is reproducible."""
    from kernel_gym.kernels import get_family
    from kernel_gym.measure.worker import workload_from_key

    fam = get_family(KERNEL)
    shapes, keys = set(exclude_shapes), set(exclude_keys)
    groups = []
    all_rows = backend.rows(KERNEL)
    for wkey in sorted(all_rows):
        if wkey in keys:
            continue
        w = workload_from_key(fam, wkey)
        if shape_of(w) in shapes:
            continue
        ok = []
        for c, meas in sorted(all_rows[wkey].items(), key=lambda kv: str(kv[0])):
            if meas.status != "ok" or not meas.median_ms or meas.median_ms <= 0:
                continue
            cfg = Config.parse(c) if isinstance(c, str) else c
            if fam.space.is_valid(cfg, w):
                ok.append((cfg, float(meas.median_ms)))
        if len(ok) < min_configs:
            continue
        configs = [c for c, _ in ok]
        groups.append(Group(w, configs, feature_matrix(w, configs), np.log([t for _, t in ok])))
    return groups


# ---- the model -------------------------------------------------------------------------------------------------------


@dataclass
class CostModel:
    """predict(workload, configs) -> log time up to a per-workload constant (lower is faster)."""

    params: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)

    def predict(self, workload: Any, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        if not configs:
            return np.zeros(0)
        return _forward(self.params, _standardise(self.params, feature_matrix(workload, configs)))[0]

    def rank(self, workload: Any, configs: Sequence[Config]) -> list[Config]:
        """The configs, predicted fastest first (ties: the given order, so a caller's preference breaks them)."""
        configs = list(dict.fromkeys(configs))
        order = np.argsort(self.predict(workload, configs), kind="stable")
        return [configs[int(i)] for i in order]

    def save(self, folder: Path | str) -> Path:
        """fused_moe.cost.npz (arrays) + fused_moe.cost.json (meta) in `folder`; returns the npz path."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        npz, meta = folder / f"{FILE_STEM}.npz", folder / f"{FILE_STEM}.json"
        _atomic(npz, lambda f: np.savez(f, **{k: np.asarray(v, dtype=np.float64) for k, v in self.params.items()}))
        _atomic(meta, lambda f: f.write(json.dumps({**self.meta, "format": FORMAT, "features": list(FEATURES)},
                                                   indent=1).encode()))
        return npz


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def exists(folder: Path | str) -> bool:
    return (Path(folder) / f"{FILE_STEM}.npz").is_file() and (Path(folder) / f"{FILE_STEM}.json").is_file()


_PARAM_NAMES = ("mu", "sd", "W0", "b0", "W1", "b1", "W2", "b2")


def load(folder: Path | str) -> CostModel:
    """The cost model saved in `folder`, read as data (no pickle) and checked against this module's feature list."""
    folder = Path(folder)
    npz, meta_path = folder / f"{FILE_STEM}.npz", folder / f"{FILE_STEM}.json"
    if not exists(folder):
        raise ValueError(f"{folder}: no cost model ({FILE_STEM}.npz + .json); fit one with "
                         "kernel_gym.dispatch.cost_model.fit_packaged().save(folder)")
    meta = json.loads(meta_path.read_text())
    if meta.get("features") != list(FEATURES) or meta.get("format") != FORMAT:
        raise ValueError(f"{meta_path}: written for another feature list or format ({meta.get('format')}); refit it "
                         "with this version (kernel_gym.dispatch.cost_model.fit_packaged().save(folder))")
    with np.load(npz, allow_pickle=False) as z:
        params = {k: np.asarray(z[k], dtype=np.float64) for k in z.files}
    d = len(FEATURES)
    shapes_ok = (set(params) == set(_PARAM_NAMES) and params["mu"].shape == (d,) and params["sd"].shape == (d,)
                 and params["W0"].shape[1] == d and params["W1"].shape[1] == params["W0"].shape[0]
                 and params["W2"].shape == (1, params["W1"].shape[0]))
    if not shapes_ok:
        raise ValueError(f"{npz}: not a cost model's arrays (expected {_PARAM_NAMES} for {d} features); refit it")
    return CostModel(params, {k: v for k, v in meta.items() if k not in ("format", "features")})


def _standardise(params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    return (x - params["mu"]) / params["sd"]


def _forward(p: Mapping[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, tuple]:
    h0 = np.tanh(x @ p["W0"].T + p["b0"])
    h1 = np.tanh(h0 @ p["W1"].T + p["b1"])
    return (h1 @ p["W2"].T + p["b2"])[:, 0], (x, h0, h1)


@dataclass(frozen=True)
class FitOptions:
    hidden: int = 64
    epochs: int = 60
    batch_workloads: int = 32
    max_rows_per_workload: int = 256  # a full-sweep workload (1,848 configs) is subsampled per epoch
    lr: float = 3e-3
    weight_decay: float = 1e-4
    seed: int = 0


def fit(groups: Sequence[Group], options: FitOptions = FitOptions(), meta: Mapping[str, Any] | None = None
        ) -> CostModel:
    """Fit the MLP on workload groups: per-workload-centred squared error of log time (clipped at CAP above the
    workload's best), every workload weighted the same. Deterministic for options.seed."""
    if not groups:
        raise ValueError("cost model fit: no workload with >= 2 ok configs; check the dataset and the exclusions")
    rng = np.random.default_rng(options.seed)
    xs = [g.x for g in groups]
    ys = [np.minimum(g.y - g.y.min(), CAP) for g in groups]
    allx = np.concatenate(xs)
    mu, sd = allx.mean(0), allx.std(0)
    sd = np.where(sd > 1e-9, sd, 1.0)
    d, hdim = len(FEATURES), options.hidden
    p = {"mu": mu, "sd": sd,
         "W0": rng.normal(0, 1 / math.sqrt(d), (hdim, d)), "b0": np.zeros(hdim),
         "W1": rng.normal(0, 1 / math.sqrt(hdim), (hdim, hdim)), "b1": np.zeros(hdim),
         "W2": rng.normal(0, 1 / math.sqrt(hdim), (1, hdim)), "b2": np.zeros(1)}
    trainable = ("W0", "b0", "W1", "b1", "W2", "b2")
    m1 = {k: np.zeros_like(p[k]) for k in trainable}
    m2 = {k: np.zeros_like(p[k]) for k in trainable}
    xs = [(x - mu) / sd for x in xs]
    step, losses = 0, []
    for epoch in range(options.epochs):
        order = rng.permutation(len(groups))
        lr = options.lr * 0.5 * (1 + math.cos(math.pi * epoch / options.epochs))  # cosine decay
        epoch_loss = 0.0
        for start in range(0, len(order), options.batch_workloads):
            idx = order[start:start + options.batch_workloads]
            bx, by, seg, inv_n = [], [], [], []
            for j, gi in enumerate(idx):
                n = len(ys[gi])
                rows = rng.choice(n, options.max_rows_per_workload, replace=False) \
                    if n > options.max_rows_per_workload else np.arange(n)
                bx.append(xs[gi][rows])
                by.append(ys[gi][rows])
                seg.append(np.full(len(rows), j))
                inv_n.append(np.full(len(rows), 1.0 / len(rows)))
            x, y, s, w = np.concatenate(bx), np.concatenate(by), np.concatenate(seg), np.concatenate(inv_n)
            pred, (x0, h0, h1) = _forward(p, x)
            err = pred - y
            mean_err = np.bincount(s, weights=err * w, minlength=len(idx))
            centred = err - mean_err[s]
            loss = float(np.sum(w * centred ** 2) / len(idx))
            epoch_loss += loss * len(idx)
            g_out = (2.0 / len(idx)) * w * centred  # the mean's own gradient sums to zero within a workload
            grads = {"W2": g_out[None, :] @ h1, "b2": np.array([g_out.sum()])}
            g1 = (g_out[:, None] @ p["W2"]) * (1 - h1 ** 2)
            grads["W1"], grads["b1"] = g1.T @ h0, g1.sum(0)
            g0 = (g1 @ p["W1"]) * (1 - h0 ** 2)
            grads["W0"], grads["b0"] = g0.T @ x0, g0.sum(0)
            step += 1
            for k in trainable:
                g = grads[k] + (options.weight_decay * p[k] if k.startswith("W") else 0.0)
                m1[k] = 0.9 * m1[k] + 0.1 * g
                m2[k] = 0.999 * m2[k] + 0.001 * g * g
                p[k] = p[k] - lr * (m1[k] / (1 - 0.9 ** step)) / (np.sqrt(m2[k] / (1 - 0.999 ** step)) + 1e-8)
        losses.append(epoch_loss / len(groups))
    info = {"kernel": KERNEL, "workloads": len(groups), "rows": int(sum(len(g.y) for g in groups)),
            "shapes": len({shape_of(g.workload) for g in groups}), "cap": CAP, "num_sms": NUM_SMS,
            "options": options.__dict__, "final_loss": round(losses[-1], 6), **(meta or {})}
    return CostModel(p, info)


def fit_packaged(backend: Any = None, options: FitOptions = FitOptions(), exclude_shapes: Iterable[tuple] = (),
                 exclude_keys: Iterable[str] | None = None) -> CostModel:
    """Fit on the packaged H200 dataset's fused_moe rows; never on a zoo test model's workloads (the live zero-shot
    tests stay held out), nor on `exclude_shapes`."""
    from kernel_gym import zoo

    if backend is None:
        from kernel_gym.measure import make_backend

        backend = make_backend("recorded")
    keys = zoo.test_workload_keys(KERNEL) if exclude_keys is None else set(exclude_keys)
    groups = training_groups(backend, exclude_shapes, keys)
    return fit(groups, options, {"dataset_sha256": getattr(backend, "dataset_hash", ""),
                                 "excluded_shapes": len(set(exclude_shapes))})


# ---- cached fit of the packaged dataset ----------------------------------------------------------------------------

_CACHE: dict[str, CostModel] = {}


def cache_dir() -> Path:
    """Where a lazily fitted cost model is kept between processes: $KERNEL_GYM_CACHE, else ~/.cache/kernel_gym."""
    return Path(os.environ.get("KERNEL_GYM_CACHE") or Path.home() / ".cache" / "kernel_gym")


def packaged(backend: Any = None) -> CostModel:
    """The cost model of the packaged dataset: fitted once (about a minute on one core), then kept in memory and in
    cache_dir() under the dataset's hash, so a changed dataset is refitted and never served a stale model."""
    if backend is None:
        from kernel_gym.measure import make_backend

        backend = make_backend("recorded")
    digest = getattr(backend, "dataset_hash", "") or "unknown"
    tag = hashlib.sha256(f"{digest}:{FORMAT}:{','.join(FEATURES)}:{FitOptions()}".encode()).hexdigest()[:16]
    if tag in _CACHE:
        return _CACHE[tag]
    folder = cache_dir() / f"cost_model-{tag}"
    model = None
    if exists(folder):
        try:
            model = load(folder)
        except ValueError:
            model = None
    if model is None:
        import sys

        print(f"[cost model] fitting the fused_moe cost model on the packaged dataset (once, about a minute; cached "
              f"in {folder})", file=sys.stderr, flush=True)
        model = fit_packaged(backend)
        try:
            model.save(folder)
        except OSError:  # a read-only home: keep it in memory only
            pass
    _CACHE[tag] = model
    return model
