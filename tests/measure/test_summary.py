"""`kernel-gym data`: progress lines while it reads and ranks (it runs for minutes on 2 cores), `--counts` skips the
slow config-space coverage, and the zoo models with rows are counted from the stored shapes."""

from __future__ import annotations

from pathlib import Path

from kernel_gym.kernels import get_family
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.summary import dataset_summary, format_summary
from kernel_gym.measure.types import OK, Measurement
from kernel_gym.models import BUILTIN_MODELS


def _store(tmp_path: Path) -> Path:
    """Two ok MoE rows at OLMoE's shape (one noisy) and one at a shape of no zoo model."""
    fam = get_family("fused_moe")
    olmoe = BUILTIN_MODELS["olmoe-1b-7b"]
    wl = MoEWorkload(16, olmoe.num_experts, olmoe.top_k, olmoe.hidden, olmoe.intermediate, 0.0, "bfloat16")
    odd = MoEWorkload(16, 3, 1, 640, 320, 0.0, "bfloat16")
    c = fam.default_config(wl)
    ms = [Measurement("fused_moe", wl.key(), str(c), OK, median_ms=0.1, spread=0.01, repeats=5),
          Measurement("fused_moe", wl.key(), str(fam.space.sample(wl, 1, seed=3)[0]), OK, median_ms=0.2, spread=9.0,
                      repeats=5),
          Measurement("fused_moe", odd.key(), str(fam.default_config(odd)), OK, median_ms=0.1, spread=0.01,
                      repeats=5)]
    path = tmp_path / "m.sqlite"
    with MeasurementStore(path) as store:
        store.put_many(Context("NVIDIA H200", "t", "t", "fused_moe", "h"), ms)
    return path


def test_counts_skips_coverage_and_reports_progress(tmp_path: Path) -> None:
    path = _store(tmp_path)
    lines: list[str] = []
    info = dataset_summary(path, coverage=False, progress=lines.append)
    k = info["kernels"]["fused_moe"]
    assert (k["rows"], k["ok"], k["ok_noisy"], k["shapes"]) == (3, 3, 1, 2)
    assert k["fraction_of_valid_configs_measured"] is None and "valid configs measured" not in format_summary(info)
    assert info["zoo_models_with_rows"] == ["olmoe-1b-7b"]
    assert lines[0].startswith("reading m.sqlite") and "read 3 rows" in lines[1]
    full: list[str] = []
    info = dataset_summary(path, progress=full.append)
    assert info["kernels"]["fused_moe"]["fraction_of_valid_configs_measured"] > 0
    assert any("fused_moe: config-space coverage of 2 shapes" in ln for ln in full)
