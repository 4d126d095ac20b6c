"""The engines' own lookup code on kernel_gym's exported files (scripts/check_engine_lookup.py, issue 24).

The committed output (benchmarks/engine_lookup/) shows the check ran at the versions kernel_gym targets; with the
engines available (pip install kernel_gym[engines], or KERNEL_GYM_ENGINE_WHEELS=DIR holding the two wheels) it runs
again here. Default CI does not install vLLM or SGLang: the live test then skips with the reason."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from kernel_gym.kernels import vllm_tables
from tests.script_module import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_committed_check_ran_at_the_targeted_versions(engine):
    version = vllm_tables.DEFAULT_VERSIONS[engine]
    res = json.loads((ROOT / "benchmarks" / "engine_lookup" / f"{engine}-{version}.json").read_text())
    assert res["engine"] == engine and res["version"] == version and res["ok"] and not res["mismatches"]
    assert res["exports_M_intended"] == res["exports_M_checked"] > 1000
    assert res["default_rule_agree"] == res["default_rule_checked"] > 100
    assert res["shipped_tables_agree"] == res["shipped_tables_checked"] > 20
    assert all(x["found_by_engine"] and x["log_level"] == ["INFO"] for x in res["exports"])  # no fallback warning
    assert any(x["ep"] > 1 for x in res["exports"])


def _wheel(engine: str) -> Path | None:
    folder = os.environ.get("KERNEL_GYM_ENGINE_WHEELS")
    if folder:
        found = sorted(Path(folder).glob(f"{engine}-{vllm_tables.DEFAULT_VERSIONS[engine]}-*.whl"))
        if found:
            return found[0]
    return None


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engine_lookup_live(engine, tmp_path):
    wheel = _wheel(engine)
    if wheel is None and importlib.util.find_spec(engine) is None:
        pytest.skip(f"{engine} {vllm_tables.DEFAULT_VERSIONS[engine]} not available: pip install kernel_gym[engines] "
                    "or set KERNEL_GYM_ENGINE_WHEELS to a folder with its wheel")
    check_engine_lookup = load_script("check_engine_lookup")

    res = check_engine_lookup.check(engine, wheel, tmp_path)
    assert res["ok"], res["mismatches"][:3]
