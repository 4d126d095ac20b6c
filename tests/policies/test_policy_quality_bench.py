"""benchmarks/policy_quality/run.py: one row per (env, model, seed) scored, and a model whose data holds no rows of
the env's kernel family skipped with a note instead of failing the whole benchmark."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_prefix_env_rows_per_seed_and_a_model_without_prefix_rows_skipped(tmp_path) -> None:
    from benchmarks.policy_quality import run as bench

    rc = bench.main(["--envs", "KernelGym/PrefixPrefill-v0", "--models", "mixtral-8x7b", "olmoe-1b-7b",
                     "--seeds", "0", "1", "--timesteps", "512", "--eval-freq", "512", "--out", str(tmp_path),
                     "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    assert rc == 0
    doc = json.loads((tmp_path / "policy_quality.json").read_text())
    assert [(r["model"], r["seed"]) for r in doc["results"]] == [("mixtral-8x7b", 0), ("mixtral-8x7b", 1)]
    assert all(r["heldout_workloads"] >= 5 and r["policy_failures"] == 0 for r in doc["results"])
    assert [(k["env_id"], k["model"]) for k in doc["skipped"]] == [("KernelGym/PrefixPrefill-v0", "olmoe-1b-7b")]
    md = (tmp_path / "policy_quality.md").read_text()
    assert "| KernelGym/PrefixPrefill-v0 | mixtral-8x7b | 1 |" in md and "Skipped" in md
    assert (tmp_path / "policy_curves" / "prefixprefill-v0-mixtral-8x7b-seed1.png").exists()
