"""Each real kernel family through the measurement path under the interpreter (small grid); skips if not written yet."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from kernel_gym.kernels import FAMILY_MODULES
from kernel_gym.kernels.workloads import model_workloads
from kernel_gym.measure.interpreter import InterpreterBackend
from kernel_gym.measure.store import Context, MeasurementStore
from kernel_gym.measure.summary import dataset_summary
from kernel_gym.measure.types import OK
from kernel_gym.measure.worker import family_store_key, workload_from_key
from kernel_gym.models import BUILTIN_MODELS


def _family(name: str):
    try:
        return importlib.import_module(FAMILY_MODULES[name]).FAMILY
    except (ImportError, AttributeError) as exc:
        pytest.skip(f"{FAMILY_MODULES[name]} not available yet: {exc}")


@pytest.mark.parametrize("kernel", list(FAMILY_MODULES))
def test_family_measures_and_stores_under_interpreter(kernel: str, tmp_path: Path) -> None:
    fam = _family(kernel)
    # float16: bf16 arithmetic is wrong in the interpreter
    wl = model_workloads(kernel, BUILTIN_MODELS["mixtral-8x7b"], grid="small", dtype="float16")[0]
    assert workload_from_key(fam, wl.key()) == wl
    configs = [fam.default_config(wl), *fam.space.sample(wl, 2, seed=1)]
    backend = InterpreterBackend()
    ms = [backend.measure(fam, wl, c) for c in dict.fromkeys(configs)]
    assert ms[0].status == OK, ms[0].reason  # the default config computes the reference's result
    assert all(m.median_ms is None and m.source == "interpreter" for m in ms)
    ctx = Context("cpu-interpreter", "t", "t", fam.name, family_store_key(fam))
    with MeasurementStore(tmp_path / "m.sqlite") as store:
        assert store.put_many(ctx, ms) == len(ms)
        assert store.integrity_check() == "ok"
    info = dataset_summary(tmp_path / "m.sqlite")
    k = info["kernels"][fam.name]
    assert k["rows"] == len(ms) and k["shapes"] == 1 and 0 < k["fraction_of_valid_configs_measured"] <= 1
    json.dumps(info)
