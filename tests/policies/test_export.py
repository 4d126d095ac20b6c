"""Export: a logged pyfunc policy (crafted, no training) -> dispatch table and vLLM config file through the CLI entry
`main(argv)`; the vLLM file has vLLM's name and schema; errors name the problem and the fix."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mlflow
import numpy as np
import pytest

from kernel_gym.cli import export as export_cli
from kernel_gym.deploy import export
from kernel_gym.dispatch.dispatcher import Dispatcher, DispatchTable
from kernel_gym.dispatch.observation import feature_names
from kernel_gym.kernels.workloads import MOE_TOKENS
from kernel_gym.models import BUILTIN_MODELS

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")
PKG = Path(export.__file__).resolve().parents[1]
A = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4, "num_stages": 3, "SPLIT_K": 1,
     "FUSE_SILU": 0, "FUSE_WEIGHT": 1, "FUSE_SUM": 0}
B = dict(A, BLOCK_M=64, GROUP_M=8)


def log_policy(tmp: Path, name: str = "kernel-gym-moe-v0", extra: dict | None = None) -> str:
    """A linear actor whose logits favour B for many tokens and A for few: a real pyfunc, no training."""
    names = feature_names("fused_moe")
    w = np.zeros((2, len(names)), np.float32)
    w[1, names.index("log2_tokens")] = 1.0  # obs in [-1, 1]: B wins when log2_tokens > 7 (obs > 0)
    np.savez(tmp / "policy.npz", W_out=w, b_out=np.zeros(2, np.float32))
    meta = {"kernel": "fused_moe", "env_id": "KernelGym/MoE-v0", "activation": "tanh", "feature_names": names,
            "configs": [A, B], "known_masks": {}, "known_obs": {}, "run_id": "r1", **(extra or {})}
    (tmp / "policy.json").write_text(json.dumps(meta))
    shutil.copy(PKG / "dispatch" / "observation.py", tmp / "kernel_gym_observation.py")
    shutil.copy(PKG / "kernels" / "workloads.py", tmp / "kernel_gym_workloads.py")
    shutil.copy(PKG / "kernels" / "profiles.py", tmp / "kernel_gym_profiles.py")
    with mlflow.start_run():
        info = mlflow.pyfunc.log_model(
            name="policy", python_model=str(PKG / "train" / "pyfunc_model.py"),
            artifacts={"policy_npz": str(tmp / "policy.npz"), "policy_json": str(tmp / "policy.json")},
            code_paths=[str(tmp / "kernel_gym_observation.py"), str(tmp / "kernel_gym_workloads.py"),
                        str(tmp / "kernel_gym_profiles.py")],
            pip_requirements=["mlflow", "numpy", "pandas"], registered_model_name=name)
    return f"models:/{name}/{info.registered_model_version}"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlexport")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    old = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    mlflow.set_tracking_uri(uri)
    yield root, log_policy(root)
    if old is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = old


def test_dispatch_export_from_registered_policy(store, tmp_path):
    _, uri = store
    assert export_cli.main(["--model-uri", uri, "--out", str(tmp_path)]) == 0
    table = DispatchTable.load(tmp_path / export.TABLE_FILE)
    t = table.kernels["fused_moe"]
    assert t.policy["model_uri"] == uri and t.policy["run_id"] == "r1"
    assert t.centers[0] == [float(m) for m in MOE_TOKENS] and len(t.centers[1]) == len(export.EXPORT_SKEWS)
    d = Dispatcher(table)
    assert dict(d.moe_config(1)) == A and dict(d.moe_config(4096)) == B  # the policy's argmax per bucket
    assert table.model["name"] == "mixtral-8x7b" and table.device == "NVIDIA H200"
    # the default: the latest registered kernel-gym-* policy
    assert export.latest_model_uris() == {"fused_moe": uri}
    assert export_cli.main(["--out", str(tmp_path / "latest")]) == 0
    assert (tmp_path / "latest" / export.TABLE_FILE).exists()


def test_latest_policy_prefers_the_one_trained_for_the_model(store, tmp_path):
    """benchmarks/replay/run.py registers kernel-gym-<env>-<model>: `export --model olmoe-1b-7b` (and the replay's
    learned policy) must take that one, and a model without its own policy the generic kernel-gym-<env>."""
    _, generic = store
    own = log_policy(tmp_path, name="kernel-gym-moe-v0-olmoe-1b-7b")
    assert export.latest_model_uris("olmoe-1b-7b") == {"fused_moe": own}
    assert export.latest_model_uris("mixtral-8x7b") == {"fused_moe": generic}
    assert export.latest_model_uris() == {"fused_moe": generic}
    assert export_cli.main(["--model", "olmoe-1b-7b", "--out", str(tmp_path / "o")]) == 0
    table = DispatchTable.load(tmp_path / "o" / export.TABLE_FILE)
    assert table.kernels["fused_moe"].policy["model_uri"] == own
    # a model-conditioned policy (kernel-gym-<env>-conditioned) comes before the bare legacy name
    cond = log_policy(tmp_path, name="kernel-gym-moe-v0-conditioned")
    assert export.latest_model_uris("mixtral-8x7b") == {"fused_moe": cond}
    assert export.latest_model_uris("olmoe-1b-7b") == {"fused_moe": own}


def test_vllm_export_has_vllm_name_and_schema(store, tmp_path):
    """--format vllm writes vLLM's file from vllm_fused_moe measurements (tests/policies/test_engine_export.py): the
    packaged data holds them for Mixtral-8x7B (H200 run 2), so its file is written from measurements; a spec without
    them is refused, and --force writes vLLM's own entries for it, marked as an estimate."""
    assert export_cli.main(["--format", "vllm", "--out", str(tmp_path / "mixtral")]) == 0
    path = tmp_path / "mixtral" / "E=8,N=14336,device_name=NVIDIA_H200.json"
    data = json.loads(path.read_text())
    keys = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"}
    assert all(set(v) == keys and all(isinstance(x, int) for x in v.values()) for v in data.values())
    assert {int(k) for k in data} >= {1, 16, 256, 4096}
    sidecar = json.loads((tmp_path / "mixtral" / "kernel_gym_export.json").read_text())
    assert sidecar["files"][path.name]["estimate"] is False
    with pytest.raises(ValueError, match="refusing to export"):
        export_cli.main(["--format", "vllm", "--model", "phi-3.5-moe", "--out", str(tmp_path / "phi")])
    assert export_cli.main(["--format", "vllm", "--model", "phi-3.5-moe", "--force", "--out",
                            str(tmp_path / "phi")]) == 0
    forced = json.loads((tmp_path / "phi" / "kernel_gym_export.json").read_text())
    assert all(f["estimate"] is True for f in forced["files"].values())


def test_export_errors_name_the_fix(store, tmp_path):
    _, uri = store
    with pytest.raises(ValueError, match="is for 'fused_moe', not 'decode_attention'"):
        export_cli.main(["--model-uri", f"decode_attention={uri}", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="not a kernel"):
        export.parse_model_uris(["moe=models:/x/1"])
    with pytest.raises(ValueError, match="kernel-gym train"):
        export_cli.main(["--model-uri", "models:/kernel-gym-nothing/1", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="PAGE_SIZE:LAYOUT"):
        export.parse_kv_layout("16-NHD")
    table = export.build_table(BUILTIN_MODELS["mixtral-8x7b"], {"prefill_attention": (
        lambda ws: [__import__("kernel_gym.kernels", fromlist=["g"]).get_family("prefill_attention").default_config(w)
                    for w in ws], {})})
    with pytest.raises(ValueError, match="needs a fused_moe policy"):
        export.write_vllm(table, tmp_path)


def test_no_registered_policy_says_run_train(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'empty.db'}")
    with pytest.raises(ValueError, match="kernel-gym train"):
        export_cli.main(["--out", str(tmp_path)])


def test_decode_layout_is_chosen_by_measured_quality_of_the_moved_choices() -> None:
    """Without --kv-layout and with measured data, the decode table runs on the layout where the policy's choices,
    moved onto it, measure best; a layout with data on only a few cells cannot win on them; without data the policy's
    most frequent layout stays."""
    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.types import OK, UNAVAILABLE, Measurement

    model = BUILTIN_MODELS["mixtral-8x7b"]
    choice = Config(BLOCK_N=64, GQA_GROUPED=1, LAYOUT="HND", NUM_SPLITS=4, PAGE_SIZE=16, num_stages=2, num_warps=4)

    class Scorer:
        """Every layout has data on every cell; 64:NHD is fastest; 128:HND is faster still but only on 3 cells."""

        def __init__(self) -> None:
            self.seen = 0

        def measure(self, kernel, workload, config):
            key = (config["PAGE_SIZE"], config["LAYOUT"])
            if key == (128, "HND"):
                self.seen += 1
                if self.seen > 3:
                    return Measurement(kernel, workload.key(), str(config), UNAVAILABLE)
            ms = {(64, "NHD"): 1.0, (128, "HND"): 0.5}.get(key, 2.0)
            return Measurement(kernel, workload.key(), str(config), OK, median_ms=ms, spread=0.01, repeats=3)

        def best_measurement(self, kernel, workload):
            return Measurement(kernel, workload.key(), "{}", OK, median_ms=0.5, spread=0.01, repeats=3)

    predict = lambda ws: [choice] * len(ws)  # noqa: E731
    t = export.build_kernel_table("decode_attention", model, predict, {}, scorer=Scorer())
    assert (t.kv_layout["page_size"], t.kv_layout["layout"]) == (64, "NHD")
    assert t.kv_layout["chosen_by"].startswith("measured") and t.kv_layout["scores"]["128:HND"]["cells"] == 3
    assert all(c["PAGE_SIZE"] == 64 and c["LAYOUT"] == "NHD" for c in t.configs)
    plain = export.build_kernel_table("decode_attention", model, predict, {})
    assert (plain.kv_layout["page_size"], plain.kv_layout["layout"]) == (16, "HND")
    given = export.build_kernel_table("decode_attention", model, predict, {}, kv_layout=(32, "NHD"), scorer=Scorer())
    assert (given.kv_layout["page_size"], given.kv_layout["layout"], given.kv_layout["chosen_by"]) == (32, "NHD",
                                                                                                       "given")
    assert export.pick_layout({}) is None


def test_policy_for_another_model_is_refused_in_one_line(store, tmp_path, capsys):
    """A policy whose metadata names its model: export names it in one line, and refuses it for another model unless
    it is model-conditioned."""
    import dataclasses

    mlflow.set_tracking_uri(os.environ["MLFLOW_TRACKING_URI"])  # the module's store (an earlier test switched it)
    olmoe = dataclasses.asdict(BUILTIN_MODELS["olmoe-1b-7b"])
    uri = log_policy(tmp_path, name="kernel-gym-moe-v0-olmoe-1b-7b", extra={"model_specs": [olmoe]})
    assert export_cli.main(["--model", "olmoe-1b-7b", "--model-uri", uri, "--out", str(tmp_path / "ok")]) == 0
    err = capsys.readouterr().err
    version = uri.rsplit("/", 1)[1]
    assert f"policy fused_moe: kernel-gym-moe-v0-olmoe-1b-7b version {version} (model olmoe-1b-7b)" in err
    with pytest.raises(ValueError, match="trained for model olmoe-1b-7b, not mixtral-8x7b: pass --model") as exc:
        export_cli.main(["--model-uri", uri, "--out", str(tmp_path / "bad")])
    assert "\n" not in str(exc.value)
    changed = dict(olmoe, num_experts=32)  # same name, other fields: not the same model
    uri2 = log_policy(tmp_path, name="kernel-gym-moe-v0-olmoe-1b-7b", extra={"model_specs": [changed]})
    with pytest.raises(ValueError, match="with other num_experts, not olmoe-1b-7b"):
        export_cli.main(["--model", "olmoe-1b-7b", "--model-uri", uri2, "--out", str(tmp_path / "bad2")])
    both = [olmoe, dataclasses.asdict(BUILTIN_MODELS["mixtral-8x7b"])]
    cond = log_policy(tmp_path, name="kernel-gym-moe-v0-conditioned",
                      extra={"model_specs": both, "model_conditioned": True})
    assert export_cli.main(["--model-uri", cond, "--out", str(tmp_path / "cond")]) == 0
    assert "(model olmoe-1b-7b,mixtral-8x7b, model-conditioned)" in capsys.readouterr().err


def write_bundle(folder: Path, specs: list[dict], conditioned: bool = True) -> Path:
    """A fused_moe policy bundle (train/bundle.py) with the linear actor of log_policy: no MLflow, no training."""
    from kernel_gym.train.bundle import save_bundle

    names = feature_names("fused_moe")
    w = np.zeros((2, len(names)), np.float32)
    w[1, names.index("log2_tokens")] = 1.0
    provenance = {"model_uri": "models:/kernel-gym-moe-v0-conditioned/7", "run_id": "r7",
                  "env_id": "KernelGym/MoE-v0", "model_specs": specs, "model_conditioned": conditioned}
    save_bundle(folder, "fused_moe", {"kernel": "fused_moe", "configs": [A, B], "activation": "tanh"},
                {"W_out": w, "b_out": np.zeros(2, np.float32)}, provenance)
    return folder


def test_policy_dir_table_records_what_each_kernel_rests_on(tmp_path, capsys):
    """export --policy-dir: a model the bundle never trained on gets zero-shot choices with the policy's identity in
    meta.rests_on; every kernel without a policy is listed as absent there and named on one line of stderr with what
    the deployment then runs; a training model's table rests on measurements."""
    import dataclasses

    from kernel_gym.models import load_model

    specs = [dataclasses.asdict(load_model(n)) for n in ("mixtral-8x7b", "mixtral-8x7b@tp2")]
    bundle = write_bundle(tmp_path / "bundle", specs)
    assert export_cli.main(["--model", "olmoe-1b-7b", "--policy-dir", str(bundle), "--out", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    table = DispatchTable.load(tmp_path / "o" / export.TABLE_FILE)
    rests = table.meta["rests_on"]
    assert set(rests) == {"fused_moe", "decode_attention", "prefill_attention"}
    moe = rests["fused_moe"]
    assert moe["basis"] == "zero-shot" and moe["policy"]["policy_dir"] == str(bundle)
    assert moe["policy"]["model_uri"] == "models:/kernel-gym-moe-v0-conditioned/7" and moe["policy"]["run_id"] == "r7"
    assert rests["decode_attention"]["basis"] == rests["prefill_attention"]["basis"] == "absent"
    left = [ln for ln in captured.err.splitlines() if " left out " in ln]
    assert len(left) == 2 and all("family's default config" in ln for ln in left)
    assert any(ln.startswith("export: prefill_attention left out") for ln in left)
    summary = json.loads(captured.out)
    assert summary["left_out"] == ["decode_attention", "prefill_attention"]
    assert summary["kernels"]["fused_moe"]["basis"] == "zero-shot"
    d = Dispatcher(table)
    assert dict(d.moe_config(1)) == A and dict(d.moe_config(4096)) == B  # the bundle's argmax under the rules
    assert export_cli.main(["--policy-dir", str(bundle), "--out", str(tmp_path / "m")]) == 0  # mixtral: trained on it
    trained = DispatchTable.load(tmp_path / "m" / export.TABLE_FILE).meta["rests_on"]["fused_moe"]
    assert trained["basis"] == "measured"
    assert export_cli.main(["--policy-dir", str(bundle), "--device", "NVIDIA A100", "--out", str(tmp_path / "a")]) == 0
    other = DispatchTable.load(tmp_path / "a" / export.TABLE_FILE).meta["rests_on"]["fused_moe"]
    assert other["basis"] == "estimate" and "NVIDIA A100" in other["why"]


def test_tp_is_honoured_for_the_dispatch_format_or_refused(tmp_path):
    """--tp N makes the table for one GPU's shard (as NAME@tpN); a model that already names a shard, a degree that
    does not split the shape and --policy-dir with an engine format are refused in one line."""
    import dataclasses

    from kernel_gym.models import load_model

    bundle = write_bundle(tmp_path / "bundle", [dataclasses.asdict(load_model(n)) for n in ("mixtral-8x7b",
                                                                                           "olmoe-1b-7b")])
    assert export_cli.main(["--tp", "2", "--policy-dir", str(bundle), "--out", str(tmp_path / "t")]) == 0
    table = DispatchTable.load(tmp_path / "t" / export.TABLE_FILE)
    assert table.model["name"] == "mixtral-8x7b@tp2" and table.kernels["fused_moe"].fixed["intermediate"] == 7168
    for argv, match in [(["--model", "mixtral-8x7b@tp2", "--tp", "2"], "already names a shard"),
                        (["--tp", "3"], "does not split tp=3 ways"), (["--tp", "0"], "--tp must be >= 1"),
                        (["--format", "vllm"], "--policy-dir is for --format dispatch")]:
        with pytest.raises(ValueError, match=match) as exc:
            export_cli.main([*argv, "--policy-dir", str(bundle), "--out", str(tmp_path / "bad")])
        assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="benchmarks/generalisation/policies"):
        export_cli.main(["--policy-dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "bad")])


def test_no_policy_for_an_unseen_model_names_the_real_fixes(tmp_path, monkeypatch):
    """Right after the demo the store holds the demo model's policies only: export for another spec must name the
    model-conditioned policy's two sources (train --model zoo, the shipped bundles) and what the store holds."""
    from kernel_gym.models import load_model

    monkeypatch.setattr(export, "latest_model_uris", lambda name=None: {})  # no policy for this model's names
    monkeypatch.setattr(export, "registered_policy_names", lambda: ["kernel-gym-moe-v0-mixtral-8x7b"])
    with pytest.raises(ValueError) as exc:
        export.load_policies([], load_model("phi-3.5-moe"))
    msg = str(exc.value)
    assert "kernel-gym train --model zoo" in msg and "--policy-dir benchmarks/generalisation/policies" in msg
    assert "kernel-gym-moe-v0-mixtral-8x7b" in msg and "phi-3.5-moe" in msg and "\n" not in msg


def test_the_docs_example_spec_loads_with_its_shared_expert() -> None:
    """docs/example_spec.json (docs/agent.md, "Your own model") is a valid spec with the optional shared-expert
    fields; the docs' commands name it and the shipped bundles."""
    from kernel_gym.models import load_model

    root = PKG.parent
    spec = load_model(str(root / "docs" / "example_spec.json"))
    assert spec.num_experts == 60 and spec.top_k == 4 and spec.num_shared_experts == 1
    assert spec.shared_intermediate == 5632 and spec.attention == "gqa"
    doc = (root / "docs" / "agent.md").read_text()
    assert "kernel-gym export --model docs/example_spec.json --policy-dir benchmarks/generalisation/policies" in doc
    assert (root / "benchmarks" / "generalisation" / "policies" / "fused_moe.json").exists()


def test_a_policy_trained_on_other_data_is_flagged_stale_with_the_fix(store, tmp_path, capsys):
    """A policy logged with another dataset hash than the packaged data's: the table's rests_on says so and export
    prints how to retrain (the live runs' table of 2026-11-30 lagged re-timed rows by up to 1.55x); the same policy
    on the current hash, and one without a hash (logged before policies carried it, run outside the store), pass
    silently."""
    mlflow.set_tracking_uri(f"sqlite:///{store[0] / 'mlflow.db'}")  # another test may have pointed MLflow elsewhere
    now = export.recorded_backend().dataset_hash
    stale = log_policy(tmp_path, name="kernel-gym-moe-v0-stale", extra={"dataset_sha256_16": "0123456789abcdef"})
    fresh = log_policy(tmp_path, name="kernel-gym-moe-v0-fresh", extra={"dataset_sha256_16": now})
    for uri, flagged in ((stale, True), (fresh, False), (store[1], False)):
        out = tmp_path / uri.split("/")[1]
        capsys.readouterr()
        assert export_cli.main(["--model-uri", uri, "--out", str(out)]) == 0
        rests = DispatchTable.load(out / export.TABLE_FILE).meta["rests_on"]["fused_moe"]
        err = capsys.readouterr().err
        assert ("stale" in rests) is flagged and ("learned from recorded dataset 0123456789abcdef" in err) is flagged
        if flagged:
            assert rests["stale"]["packaged_dataset"] == now
            assert "kernel-gym train --env-id KernelGym/MoE-v0 --model mixtral-8x7b" in rests["stale"]["fix"]
            # the table keeps the hash, so a later replay of the file says it too
            assert rests["policy"]["dataset_sha256_16"] == "0123456789abcdef"
            from kernel_gym.evaluate.replay import learned_policy

            learned_policy(BUILTIN_MODELS["mixtral-8x7b"], table_path=str(out / export.TABLE_FILE))
            assert "learned from recorded dataset 0123456789abcdef" in capsys.readouterr().err


def test_a_policy_logged_without_the_hash_is_checked_by_its_runs_tag(store, tmp_path, capsys):
    """Policies logged before policy.json carried the dataset hash: export reads their training run's
    data.dataset_hash tag instead (safe_policy.run_dataset_hash)."""
    mlflow.set_tracking_uri(f"sqlite:///{store[0] / 'mlflow.db'}")
    with mlflow.start_run() as run:
        mlflow.set_tag("data.dataset_hash", "fedcba9876543210")
    uri = log_policy(tmp_path, name="kernel-gym-moe-v0-old", extra={"run_id": run.info.run_id})
    assert export_cli.main(["--model-uri", uri, "--out", str(tmp_path / "t")]) == 0
    rests = DispatchTable.load(tmp_path / "t" / export.TABLE_FILE).meta["rests_on"]["fused_moe"]
    assert rests["stale"]["trained_on_dataset"] == "fedcba9876543210"
    assert "learned from recorded dataset fedcba9876543210" in capsys.readouterr().err


def test_a_kernel_left_out_of_explicit_uris_names_its_registered_policy(store, tmp_path, monkeypatch):
    """`--model-uri fused_moe=URI` alone told the user to train decode and prefill policies that the store already
    held; the note now names the registered one."""
    _, uri = store
    held = "models:/kernel-gym-decodeattention-v0-mixtral-8x7b/3"
    monkeypatch.setattr(export, "latest_model_uris", lambda name=None: {"decode_attention": held})
    assert export_cli.main(["--model-uri", f"fused_moe={uri}", "--out", str(tmp_path)]) == 0
    rests = json.loads((tmp_path / export.TABLE_FILE).read_text())["meta"]["rests_on"]
    assert rests["decode_attention"]["basis"] == "absent"
    assert f"--model-uri decode_attention={held} as well" in rests["decode_attention"]["fix"]
    assert "train" in rests["prefill_attention"]["fix"] or "measure" in rests["prefill_attention"]["fix"]
