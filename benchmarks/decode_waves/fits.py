"""How well the decode wave model (kernel_gym.traffic.decode_waves) holds for every decode config in the dataset.

For each decode shape (heads, kv heads, head dim, dtype) and each config the packaged H200 dataset times there, this
fits the model exactly as the simulator does (Simulator._fit_waves: the timer's times at the fit grid of batches and
contexts, interpolated where the grid point has no row): `fitted`. Then, to check the model on times it never saw, it
fits again on the config's stored rows at the grid points only (no interpolation) and compares with its stored rows
off the grid (other batches and contexts): `held_out_abs_error`. CPU only, from the committed dataset.

    python benchmarks/decode_waves/fits.py                 # every shape: fits.json beside this file (~30 s)
    python benchmarks/decode_waves/fits.py --out /tmp/f.json --shapes 32/8/128
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernel_gym.kernels.decode_attention import SPACE, program_rounds  # noqa: E402
from kernel_gym.kernels.workloads import DecodeWorkload  # noqa: E402
from kernel_gym.measure import make_backend  # noqa: E402
from kernel_gym.traffic import decode_waves as dw  # noqa: E402
from kernel_gym.traffic.simulator import BackendTimer  # noqa: E402

HERE = Path(__file__).resolve().parent


def shape_of(wl: DecodeWorkload) -> str:
    return f"{wl.num_heads}/{wl.num_kv_heads}/{wl.head_dim}/{wl.dtype}"


def fit_config(timer: BackendTimer, shape: tuple[int, int, int, str], cfg: object,
               stored: dict[tuple[int, int], float] | None = None) -> dw.WaveFit | None:
    """decode_waves.fit for one config at one shape: with the timer's times at the fit grid (as the simulator), or
    with `stored` {(batch, context): seconds}, the config's own rows there only."""
    h, kvh, d, dtype = shape

    def time_at(b: int, c: int) -> float | None:
        if stored is not None:
            return stored.get((b, c))
        wl = DecodeWorkload(h, kvh, d, b, c, dtype)
        if not SPACE.is_valid(cfg, wl):
            return None
        try:
            return timer.time_s("decode_attention", wl, cfg)
        except (LookupError, RuntimeError, ValueError):
            return None

    def rounds_at(b: int, c: int) -> list[list[int]]:
        return program_rounds(DecodeWorkload(h, kvh, d, b, c, dtype).context_lens(), cfg, h, kvh)

    return dw.fit(time_at, rounds_at)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=HERE / "fits.json")
    p.add_argument("--shapes", default="", help="comma list of HEADS/KV_HEADS/HEAD_DIM to keep (default: all)")
    args = p.parse_args(argv)
    t0 = time.time()
    backend = make_backend("recorded")
    timer = BackendTimer(backend)
    keep = {s for s in args.shapes.split(",") if s}
    rows: dict[str, dict[str, list[tuple[DecodeWorkload, float]]]] = defaultdict(lambda: defaultdict(list))
    configs: dict[str, object] = {}
    for wl in backend.workloads("decode_attention"):
        if keep and "/".join(shape_of(wl).split("/")[:3]) not in keep:
            continue
        for cfg_key, m in backend.rows("decode_attention").get(wl.key(), {}).items():
            if m.ok and m.median_ms:
                rows[shape_of(wl)][cfg_key].append((wl, m.median_ms * 1e-3))
                configs[cfg_key] = m.config
    from kernel_gym.train.tracking import git_commit

    out: dict = {"what": "decode_waves fits", "commit": git_commit(), "numpy": np.__version__,
                 "dataset": getattr(backend, "describe", lambda: {})(),
                 "max_fit_error": dw.MAX_FIT_ERROR, "shapes": {}}
    for shape, per_cfg in sorted(rows.items()):
        heads, kv_heads, head_dim, dtype = shape.split("/")
        h, kvh, d = int(heads), int(kv_heads), int(head_dim)
        fitted, unfitted, strict_fitted, fit_errors, held_errors = 0, 0, 0, [], []
        for cfg_key, measured in per_cfg.items():
            cfg = backend._cfg(configs[cfg_key]) if hasattr(backend, "_cfg") else configs[cfg_key]
            fit = fit_config(timer, (h, kvh, d, dtype), cfg)
            if fit is None:
                unfitted += 1
                continue
            fitted += 1
            fit_errors.append(fit.median_error)
            strict = fit_config(timer, (h, kvh, d, dtype), cfg, {(wl.batch, wl.context_len): t for wl, t in measured})
            if strict is None:
                continue
            strict_fitted += 1
            for wl, t in measured:
                if wl.batch in dw.FIT_BATCHES and wl.context_len in dw.FIT_CONTEXTS:
                    continue  # a fit point: in sample
                pred = strict.seconds(program_rounds(wl.context_lens(), cfg, h, kvh))
                held_errors.append(abs(pred / t - 1))
        q = (lambda a, p: float(np.percentile(a, p)) if len(a) else None)
        out["shapes"][shape] = {
            "workloads": len({wl.key() for rows_ in per_cfg.values() for wl, _ in rows_}),
            "configs": len(per_cfg), "fitted": fitted, "unfitted": unfitted,
            "fitted_on_stored_grid_rows": strict_fitted,
            "fit_median_error": {"median": q(fit_errors, 50), "p90": q(fit_errors, 90)},
            "held_out_rows": len(held_errors),
            "held_out_abs_error": {"median": q(held_errors, 50), "p90": q(held_errors, 90)}}
        s = out["shapes"][shape]
        print(f"{shape:>18}: {fitted:4d} of {len(per_cfg):4d} configs fit (median error "
              f"{s['fit_median_error']['median']}), {len(held_errors)} held-out rows: |error| median "
              f"{s['held_out_abs_error']['median']}, p90 {s['held_out_abs_error']['p90']}", file=sys.stderr, flush=True)
    out["seconds"] = round(time.time() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} in {out['seconds']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
