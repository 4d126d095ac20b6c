"""Zero-shot candidates: the policy's ranking over the catalogue, its re-ranking by the cost model, the engine's
own entry and the nearest measured shapes' winners. Below both tune.py and export.py (export ranks with these,
tune also exports a table), so neither imports the other both ways; tune re-exports every name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kernel_gym.kernels.space import Config


def ranker(kernel: str, meta: dict[str, Any], params: dict[str, np.ndarray]) -> Any:
    """rank(workload) -> the catalogue configs the knob-space rules allow there, the policy's most preferred first:
    the same masked logits the exported model's argmax uses for a workload it never saw."""
    from kernel_gym.dispatch import observation
    from kernel_gym.kernels import get_family

    space = get_family(kernel).space
    configs = [Config(c) for c in meta["configs"]]

    def rank(workload: Any) -> list[Config]:
        mask = np.array([space.is_valid(c, workload) for c in configs], dtype=bool)
        if not mask.any():
            return []
        logits = observation.actor_logits(params, meta["activation"], observation.observe(workload)[None, :])[0]
        order = np.argsort(-np.where(mask, logits, -np.inf), kind="stable")
        return [configs[int(i)] for i in order if mask[i]]

    return rank


def zero_shot_ranker(kernel: str, meta: dict[str, Any], params: dict[str, np.ndarray], cost: Any = None,
                     nearest: Any = None) -> Any:
    """rank(workload) -> the product's zero-shot candidates, predicted fastest first. With a fused_moe cost model
    (dispatch/cost_model.py): every catalogue entry the rules allow (the policy's top 8 among them), the nearest
    measured shapes' winners (`nearest`: a NearestWinners), the engine's entry and then every other config the rules
    allow (the valid space holds 1-3k configs; ranking them takes well under a second), ordered by the cost model
    (ties in that order). Far from the training shapes the policy's argmax alone was poor (design leave-half-out
    0.919, p5 0.729), and a candidate set of the catalogue alone capped what any ranking could reach (its best member:
    p5 0.79 on the first far split). Without a cost model, or for another kernel: `ranker`'s order, the policy's
    top-1 first."""
    rank = ranker(kernel, meta, params)
    if cost is None or kernel != "fused_moe":
        return rank
    from kernel_gym.kernels import get_family

    space = get_family(kernel).space
    memo: dict[str, list[Config]] = {}  # tune ranks each grid cell twice (its plan, then its zero-shot fallback)

    def rerank(workload: Any) -> list[Config]:
        key = workload.key()
        if key not in memo:
            cands = rank(workload)  # the whole valid catalogue, the policy's order (it breaks the cost model's ties)
            if nearest is not None:
                cands += [c for c in nearest(workload) if space.is_valid(c, workload)]
            engine = engine_candidate(workload)
            if engine is not None:
                cands.append(engine)
            cands += space.valid_configs(workload)
            memo[key] = cost.rank(workload, list(dict.fromkeys(cands))) if cands else []
        return list(memo[key])

    return rerank


# ---- candidates a wrong policy cannot mislead ------------------------------------------------------------------
# The policy's ranking is one source among four: at a shape far from training every one of its top-k can be wrong
# (a TP-8 shard with N = 64 got only 128/256-wide tiles). So tune also measures the winners at the nearest measured
# shapes, the engine's own entry translated to the kernel (what a vLLM user runs today: never keep anything slower),
# and a local-search round of one-knob steps around the best measured so far.
NEAREST_SHAPES = 3  # measured shapes whose winners join the candidates
def engine_candidate(workload: Any) -> Config | None:
    """vLLM's own config for this M and shape (its shipped H200 table's nearest M, else its default rule) as a
    fused_moe config with vLLM's fusions (separate SiLU-and-mul, weight in the down epilogue, separate top-k sum), or
    None where it is not a valid tile here."""
    from kernel_gym.kernels import get_family, vllm_moe

    if workload.kernel != "fused_moe":
        return None
    try:
        entry = vllm_moe.FAMILY.engine_config(workload)
    except (ValueError, KeyError):
        return None
    space = get_family("fused_moe").space
    for block_m in _snapped_block_m(int(entry["BLOCK_SIZE_M"]), workload):
        config = Config(BLOCK_M=block_m, BLOCK_N=int(entry["BLOCK_SIZE_N"]), BLOCK_K=int(entry["BLOCK_SIZE_K"]),
                        GROUP_M=1 if int(entry["GROUP_SIZE_M"]) == 1 else 8, num_warps=int(entry["num_warps"]),
                        num_stages=int(entry["num_stages"]), SPLIT_K=1, FUSE_SILU=0, FUSE_WEIGHT=1, FUSE_SUM=0)
        if space.is_valid(config, workload):
            return config
    return None


def _snapped_block_m(block_m: int, workload: Any) -> list[int]:
    """fused_moe's BLOCK_M values nearest to vLLM's BLOCK_SIZE_M, nearest first: vLLM's tables also use 32 and 256,
    which fused_moe has not (16/64/128). A tie (32: 16 or 64) goes to the smaller tile when an expert gets fewer
    token slots than the larger one holds (less padding), else to the larger."""
    from kernel_gym.kernels import get_family

    values = list(get_family("fused_moe").space.knob("BLOCK_M").values)
    slots_per_expert = workload.num_tokens * workload.top_k / max(1, workload.num_experts)

    def rank(v: int) -> tuple[float, int]:
        distance = abs(math.log2(v) - math.log2(block_m))
        return distance, (v if slots_per_expert < v else -v)

    return sorted(values, key=rank)


class NearestWinners:
    """The fastest stored config at the measured workloads of the same M and skew (nearest M where none has it),
    from the `NEAREST_SHAPES` shapes nearest to a query's in the coverage measure's cube."""

    def __init__(self, backend: Any = None) -> None:
        from kernel_gym.dispatch.shape_coverage import Shape

        if backend is None:
            from kernel_gym.measure import make_backend

            backend = make_backend("recorded")
        from kernel_gym.kernels import get_family
        from kernel_gym.measure.worker import workload_from_key

        fam = get_family("fused_moe")
        self._by_shape: dict[tuple, dict[tuple[int, float], Config]] = {}
        self._points: dict[tuple, tuple[float, ...]] = {}
        for wkey, rows in backend.rows("fused_moe").items():
            w = workload_from_key(fam, wkey)
            ok = [(m.median_ms, c) for c, m in rows.items() if m.status == "ok" and m.median_ms]
            ok = [(t, Config.parse(c) if isinstance(c, str) else c) for t, c in ok]
            ok = [(t, c) for t, c in ok if fam.space.is_valid(c, w)]
            if not ok:
                continue
            shape = (w.num_experts, w.top_k, w.hidden, w.intermediate, w.dtype)
            self._by_shape.setdefault(shape, {})[(w.num_tokens, float(w.skew))] = min(ok, key=lambda x: x[0])[1]
            self._points[shape] = Shape("", *shape[:4]).point()

    def __call__(self, workload: Any, k: int = NEAREST_SHAPES) -> list[Config]:
        import math

        from kernel_gym.dispatch.shape_coverage import Shape

        q = Shape("", workload.num_experts, workload.top_k, workload.hidden, workload.intermediate).point()
        own = (workload.num_experts, workload.top_k, workload.hidden, workload.intermediate, workload.dtype)
        shapes = sorted((math.dist(q, p), s) for s, p in self._points.items() if s != own and s[4] == workload.dtype)
        out = []
        for _, s in shapes[:k]:
            cells = self._by_shape[s]
            m = min(cells, key=lambda c: (abs(math.log2(c[0]) - math.log2(workload.num_tokens)),
                                          abs(c[1] - float(workload.skew))))
            out.append(cells[m])
        return out
