"""The trust boundary (issue 25 item 1): policies and checkpoints a user receives are read as data. Each crafted
artifact is made here; a payload that would create a marker file must not create it, and every refusal is one line
naming the file."""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from kernel_gym.kernels import get_family
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.models import load_model
from kernel_gym.train import bundle
from kernel_gym.train.safe_policy import PolicyFileError, load_safe_policy

FAM = get_family("fused_moe")
W1 = MoEWorkload(256, 8, 2, 4096, 14336)
MIXTRAL = asdict(load_model("mixtral-8x7b"))
OLMOE = asdict(load_model("olmoe-1b-7b"))


class Payload:
    """Unpickling this creates the marker file: proof that a pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


def configs() -> list[dict]:
    c = FAM.default_config(W1)
    return [dict(c), dict(c.replace(num_warps=8))]


def arrays(n_actions: int = 2, obs_dim: int = 8, hidden: int = 4) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"W0": rng.normal(size=(hidden, obs_dim)).astype(np.float32), "b0": np.zeros(hidden, np.float32),
            "W_out": np.zeros((n_actions, hidden), np.float32),  # b_out decides: action 1
            "b_out": np.array([0.0, 1.0][:n_actions], np.float32)}


def model_folder(root: Path, marker: Path, meta: dict | None = None, params: dict | None = None) -> Path:
    """An MLflow model folder as a crafted one would look: code that writes the marker on import, a cloudpickled
    python_model that writes it on unpickling, and (unless None) kernel_gym policy artifacts."""
    folder = root / "model"
    (folder / "artifacts").mkdir(parents=True)
    (folder / "code").mkdir()
    (folder / "pyfunc_model.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    (folder / "python_model.pkl").write_bytes(pickle.dumps(Payload(marker)))
    (folder / "MLmodel").write_text(
        "flavors:\n  python_function:\n    loader_module: mlflow.pyfunc.loaders.code_model\n"
        "    model_code_path: pyfunc_model.py\n    python_model: python_model.pkl\n    code: code\n")
    if meta is not None:
        (folder / "artifacts" / "policy.json").write_text(json.dumps(meta))
    if params is not None:
        np.savez(folder / "artifacts" / "policy.npz", **params)
    return folder


def good_meta(**kw) -> dict:
    meta = {"kernel": "fused_moe", "env_id": "KernelGym/MoE-v0", "activation": "tanh", "configs": configs(),
            "known_masks": {W1.key(): [True, True]}, "known_obs": {W1.key(): [0.0] * 8},
            "model_specs": [MIXTRAL], "model_conditioned": False, "run_id": "r1"}
    meta.update(kw)
    return meta


def test_a_crafted_model_folder_is_read_as_data_and_its_code_never_runs(tmp_path):
    marker = tmp_path / "marker"
    folder = model_folder(tmp_path, marker, good_meta(), arrays())
    for uri in (str(folder), folder.as_uri()):
        policy = load_safe_policy(uri)
        assert policy.kernel == "fused_moe" and policy.provenance["model_specs"][0]["name"] == "mixtral-8x7b"
        assert [str(c) for c in policy.predict([W1])] == [str(FAM.default_config(W1).replace(num_warps=8))]
    assert not marker.exists()


def test_export_of_a_crafted_model_without_policy_files_fails_in_one_line_and_runs_nothing(tmp_path, capsys):
    from kernel_gym.cli import main
    from tests.fakes.mlflow_store import fresh_store

    marker = tmp_path / "marker"
    folder = model_folder(tmp_path, marker)  # code and pickle only
    rc = main(["export", "--model-uri", str(folder), "--out", str(tmp_path / "out"),
               "--tracking-uri", fresh_store(tmp_path)])
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if "error" in ln]
    assert rc == 2 and len(errors) == 1 and "not a kernel_gym policy" in errors[0] and "Traceback" not in err, err
    assert not marker.exists()


@pytest.mark.parametrize("case, needle", [
    ("nan", "non-finite weights"),
    ("inf", "non-finite weights"),
    ("unknown_knob", "differ from the space's knobs"),
    ("bad_value", "BLOCK_M=7 is not one of"),
    ("conditioned_claim", "claims model_conditioned"),
    ("conditioned_string", "model_conditioned must be true or false"),
    ("env_of_other_kernel", "is not an env of 'fused_moe'"),
    ("bad_spec", "num_experts=1000000000 is beyond"),
    ("shape", "do not chain"),
    ("actions", "for 2 configs"),
    ("activation", "activation 'sigmoid'"),
    ("masks", "known_masks"),
    ("extra_array", "expected"),
])
def test_crafted_policy_files_are_refused_naming_the_file(tmp_path, case, needle):
    meta, params = good_meta(), arrays()
    if case in ("nan", "inf"):
        params["W0"][0, 0] = np.nan if case == "nan" else np.inf
    elif case == "unknown_knob":
        meta["configs"][1] = {**meta["configs"][1], "EVIL": 1}
    elif case == "bad_value":
        meta["configs"][1] = {**meta["configs"][1], "BLOCK_M": 7}
    elif case == "conditioned_claim":
        meta["model_conditioned"] = True  # one spec: the claim would only skip the identity check
    elif case == "conditioned_string":
        meta["model_conditioned"] = "true"
    elif case == "env_of_other_kernel":
        meta["env_id"] = "KernelGym/DecodeAttention-v0"
    elif case == "bad_spec":
        meta["model_specs"] = [{**MIXTRAL, "num_experts": 10**9}]
    elif case == "shape":
        params["W0"] = np.zeros((4, 5), np.float32)
    elif case == "actions":
        params["W_out"], params["b_out"] = np.zeros((3, 4), np.float32), np.zeros(3, np.float32)
    elif case == "activation":
        meta["activation"] = "sigmoid"
    elif case == "masks":
        meta["known_masks"] = {W1.key(): [True]}
    elif case == "extra_array":
        params["Z"] = np.zeros(1, np.float32)
    folder = model_folder(tmp_path, tmp_path / "marker", meta, params)
    with pytest.raises(PolicyFileError, match=needle) as info:
        load_safe_policy(str(folder))
    assert str(folder) in str(info.value) and "\n" not in str(info.value)


def npz_with_lying_header(path: Path, shape: tuple[int, ...], real: int = 1000) -> None:
    """An .npz whose W0 header claims `shape` but holds `real` floats (the audit's 13.4 GiB claim in a small file)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": shape})
    buf.write(np.zeros(real, np.float32).tobytes())
    ok = arrays()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("W0.npy", buf.getvalue())
        for k in ("b0", "W_out", "b_out"):
            b = io.BytesIO()
            np.save(b, ok[k])
            z.writestr(f"{k}.npy", b.getvalue())


@pytest.mark.parametrize("shape, needle", [((60000, 60000), "limit"), ((4, 8), "holds")])
def test_npz_header_is_checked_before_allocating(tmp_path, shape, needle):
    folder = model_folder(tmp_path, tmp_path / "marker", good_meta())
    npz_with_lying_header(folder / "artifacts" / "policy.npz", shape)
    with pytest.raises(PolicyFileError, match=needle):
        load_safe_policy(str(folder))


def test_object_arrays_are_refused_without_unpickling(tmp_path):
    marker = tmp_path / "marker"
    folder = model_folder(tmp_path, marker, good_meta())
    params = {**arrays(), "W0": np.array([Payload(marker)], dtype=object)}
    np.savez(folder / "artifacts" / "policy.npz", **params)
    with pytest.raises(PolicyFileError, match="dtype object"):
        load_safe_policy(str(folder))
    assert not marker.exists()


def save_policy_dir(root: Path, meta: dict, params: dict, provenance: dict) -> Path:
    folder = root / "policies"
    bundle.save_bundle(folder, "fused_moe", meta, params, provenance)
    return folder


@pytest.mark.parametrize("case, needle", [
    ("nan", "non-finite weights"),
    ("conditioned", "claims model_conditioned"),
    ("unknown_knob", "differ from the space's knobs"),
    ("huge", "limit"),
])
def test_tune_policy_dir_refuses_crafted_bundles_in_one_line(tmp_path, capsys, case, needle):
    from kernel_gym.cli import main

    meta = {"kernel": "fused_moe", "configs": configs(), "activation": "tanh"}
    params, prov = arrays(), {"model_uri": "models:/x/1", "model_specs": [MIXTRAL], "model_conditioned": False}
    if case == "nan":
        params["b_out"][0] = np.nan
    elif case == "conditioned":
        prov["model_conditioned"] = True
    elif case == "unknown_knob":
        meta["configs"][0] = {"EVIL": 1}
    folder = save_policy_dir(tmp_path, meta, params, prov)
    if case == "huge":
        npz_with_lying_header(folder / "fused_moe.npz", (60000, 60000))
    rc = main(["tune", "--model", "olmoe-1b-7b", "--kernels", "fused_moe", "--policy-dir", str(folder), "--dry-run"])
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if "error" in ln]
    assert rc == 2 and len(errors) == 1 and needle in errors[0] and str(folder) in errors[0], err


def test_tune_policy_dir_accepts_a_good_bundle(tmp_path, capsys):
    from kernel_gym.cli import main

    meta = {"kernel": "fused_moe", "configs": configs(), "activation": "tanh"}
    prov = {"model_uri": "models:/x/1", "model_specs": [MIXTRAL, OLMOE], "model_conditioned": True}
    folder = save_policy_dir(tmp_path, meta, arrays(), prov)
    assert not list(folder.glob(".*tmp"))  # written through temp files
    rc = main(["tune", "--model", "olmoe-1b-7b", "--kernels", "fused_moe", "--policy-dir", str(folder), "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and "policy fused_moe: x version 1" in out and "model-conditioned" in out


# ---- train --resume: a checkpoint zip is loaded as weights only --------------------------------------------------


def crafted_checkpoint(folder: Path, marker: Path, model: str = "mixtral-8x7b") -> None:
    """state.json and a latest.zip whose pickled "data" member would create the marker (SB3's full loader would)."""
    folder.mkdir(parents=True)
    payload = base64.b64encode(pickle.dumps(Payload(marker))).decode()
    data = {"policy_class": {":type:": "<class 'abc.ABCMeta'>", ":serialized:": payload}}
    with zipfile.ZipFile(folder / "latest.zip", "w") as z:
        z.writestr("data", json.dumps(data))
        buf = io.BytesIO()
        import torch

        torch.save({"w": torch.zeros(1)}, buf)
        z.writestr("policy.pth", buf.getvalue())
    (folder / "state.json").write_text(json.dumps({"run_id": "x", "num_timesteps": 8, "env_id": "KernelGym/MoE-v0",
                                                   "seed": 0, "model": model, "eval_history": []}))


def resume_args(ckpt: Path, **kw):
    from kernel_gym.train.train import TrainArgs

    return TrainArgs(env_id="KernelGym/MoE-v0", total_timesteps=64, n_steps=8, n_envs=2, batch_size=16, eval_freq=0,
                     checkpoint_freq=0, checkpoint_dir=str(ckpt), resume=True, progress_bar=False, log_model=False,
                     experiment="t", **kw)


@pytest.fixture
def store(tmp_path, monkeypatch):
    from tests.fakes.mlflow_store import fresh_store

    monkeypatch.setenv("MLFLOW_TRACKING_URI", fresh_store(tmp_path))
    return tmp_path


def test_resume_loads_weights_only_and_never_unpickles(store):
    from kernel_gym.train.train import train
    from tests.fakes.analytic_backend import AnalyticBackend

    marker, ckpt = store / "marker", store / "ckpt"
    crafted_checkpoint(ckpt, marker)
    with pytest.raises(ValueError, match="weights do not fit") as info:
        train(resume_args(ckpt), backend=AnalyticBackend())
    assert "latest.zip" in str(info.value) and "\n" not in str(info.value)
    assert not marker.exists()


def test_resume_refuses_another_models_checkpoint_in_one_line(store):
    from kernel_gym.train.train import train
    from tests.fakes.analytic_backend import AnalyticBackend

    ckpt = store / "ckpt"
    crafted_checkpoint(ckpt, store / "marker", model="olmoe-1b-7b")
    with pytest.raises(ValueError, match="trained for model olmoe-1b-7b, not mixtral-8x7b: pass --model olmoe"):
        train(resume_args(ckpt), backend=AnalyticBackend())


def test_a_second_writer_on_one_checkpoint_folder_is_refused(tmp_path):
    from kernel_gym.train.train import FolderLock

    first = FolderLock(tmp_path / "ck", "checkpoint folder")
    with pytest.raises(ValueError, match=f"in use by another process \\(pid {os.getpid()}\\)"):
        FolderLock(tmp_path / "ck", "checkpoint folder")
    first.release()
    FolderLock(tmp_path / "ck", "checkpoint folder").release()  # free again once the first is gone


def test_run_and_checkpoint_names_carry_env_model_and_seed():
    from kernel_gym.train.train import TrainArgs, default_checkpoint_dir

    a = TrainArgs(model="mixtral-8x7b", seed=3)
    b = TrainArgs(model="olmoe-1b-7b", seed=3)
    z = TrainArgs(model="zoo", exclude_models="dbrx", seed=0)
    assert a.run_label == "moe-v0-mixtral-8x7b-seed3" and b.run_label == "moe-v0-olmoe-1b-7b-seed3"
    assert z.run_label == "moe-v0-zoo-minus-dbrx-seed0"
    assert default_checkpoint_dir(a, "r1") != default_checkpoint_dir(a, "r2")  # one folder per run


def test_a_logged_policy_answers_the_same_read_as_data_as_through_mlflow(store):
    """Parity: the safe reader (export, replay, tune) picks what the logged pyfunc model picks, on seen workloads,
    unseen ones (rules mask) and through the registry's models:/ URI and the model's own folder."""
    import mlflow
    import pandas as pd

    from kernel_gym.train.train import TrainArgs, train
    from tests.fakes.analytic_backend import AnalyticBackend

    res = train(TrainArgs(env_id="KernelGym/MoE-v0", total_timesteps=64, n_steps=8, n_envs=2, batch_size=16,
                          eval_freq=0, checkpoint_freq=0, checkpoint_dir=str(store / "ck"), progress_bar=False,
                          experiment="t"), backend=AnalyticBackend())
    pyfunc = mlflow.pyfunc.load_model(res.model_uri)  # our own model, in our own store
    inner = pyfunc.unwrap_python_model()
    seen = [__import__("kernel_gym.kernels.workloads", fromlist=["x"]).workload_from_key("fused_moe", k)
            for k in list(inner.known_masks)[:6]]
    unseen = [MoEWorkload(m, 8, 2, 4096, 14336, 0.3) for m in (3, 40, 700)]
    want = list(pyfunc.predict(pd.DataFrame({"workload_key": [w.key() for w in seen + unseen]}))["config"])
    folder = Path(mlflow.artifacts.download_artifacts(res.model_uri, dst_path=str(store / "dl")))
    for uri in (res.model_uri, str(folder)):
        got = [str(c) for c in load_safe_policy(uri).predict(seen + unseen)]
        assert got == want
