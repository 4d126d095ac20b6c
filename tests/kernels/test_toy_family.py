"""Adding a kernel family takes its module, its profile and its env line (docs/architecture.md): a toy family
(tests/kernels/toy_family.py) registered that way is picked up by the store, the recorded backend, the dispatch
table and the env machinery without any other edit."""

from __future__ import annotations

import math

import gymnasium
import numpy as np
import pytest
import torch
import toy_family

from kernel_gym.kernels import FAMILY_NAMES, get_family, profiles
from kernel_gym.kernels.profiles import Interpolation, KernelProfile
from kernel_gym.kernels.space import Config
from kernel_gym.measure.types import OK, Measurement

NAME = toy_family.NAME
ENV_ID = "KernelGym/ToyAxpy-v0"
PROFILE = KernelProfile(
    name=NAME,
    module=toy_family.__name__,
    version=1,
    workload=f"{toy_family.__name__}:ToyWorkload",
    features=(("log2_batch", 0.0, 10.0), ("log2_width", 0.0, 14.0), ("dtype_bytes", 1.0, 4.0)),
    extra_features=lambda w: {},
    grid=f"{toy_family.__name__}:grid",
    legacy_hashes={"0123456789abcdef": 1},
    interpolation=Interpolation(("batch",), lambda w: (math.log2(w.batch),), (2.0,)),
    fixed_fields=("width",),
    dispatch_axes=(("batch", "width"), (True, True)),
    axis_values=lambda w: (float(w.batch), float(w.width)),
    cell_workload=lambda f, x0, x1: toy_family.ToyWorkload(int(x0), int(f["width"]), f.get("dtype", "float32")),
    small_workload=lambda f: toy_family.ToyWorkload(2, int(f["width"])),
    export_grid=lambda: ([1.0, 4.0, 16.0], [256.0]),
    jitter_axes=(("batch", (("log2_batch", 1.0),)),),
)


def _time_ms(w: toy_family.ToyWorkload, c: Config) -> float:
    """A made-up time: BLOCK 128 wins at large batch, BLOCK 32 at small."""
    return 0.01 * w.batch * (1.0 + abs(math.log2(c["BLOCK"]) - (7 if w.batch >= 8 else 5))) / c["num_warps"] ** 0.1


@pytest.fixture
def toy(monkeypatch, tmp_path):
    """The family's profile and env line registered (undone after the test), and a snapshot of made-up rows."""
    from kernel_gym.envs import KERNEL_ENVS
    from kernel_gym.measure.store import Context, MeasurementStore
    from kernel_gym.measure.worker import family_store_key

    monkeypatch.setitem(profiles.PROFILES, NAME, PROFILE)
    monkeypatch.setitem(KERNEL_ENVS, "ToyAxpy", ("kernel_gym.envs.base:KernelConfigEnv", NAME, {"kernel": NAME}))
    family, model = get_family(NAME), toy_family.ToyModel()
    rows = [Measurement(NAME, w.key(), str(c), OK, median_ms=_time_ms(w, c), spread=0.01, repeats=3, source="live")
            for w in toy_family.grid(model) for c in family.space.valid_configs(w)]
    ctx = Context("NVIDIA H200", "t", "tr", NAME, family_store_key(family))
    snap = tmp_path / "toy.jsonl.gz"
    with MeasurementStore(tmp_path / "toy.sqlite") as store:
        store.put_many(ctx, rows)
        store.put_many(Context("NVIDIA H200", "t", "tr", NAME, "0123456789abcdef"), rows[:1])  # a legacy key
        store.export_snapshot(snap)
    yield family, model, snap
    gymnasium.registry.pop(ENV_ID, None)
    gymnasium.registry.pop("KernelGym/ToyAxpy-live-v0", None)


def test_the_family_runs_and_keys_its_rows_on_its_version(toy):
    from kernel_gym.measure.store import iter_snapshot
    from kernel_gym.measure.worker import family_store_key

    family, model, snap = toy
    assert NAME in FAMILY_NAMES and family_store_key(family) == "v1"
    w = toy_family.grid(model, "small")[1]
    inputs = family.make_inputs(w, "cuda" if torch.cuda.is_available() else "cpu")
    out = family.prepare(inputs, family.default_config(w))()
    assert torch.allclose(out, family.reference(inputs), atol=1e-5)
    assert {c.source_hash for c, _ in iter_snapshot(snap)} == {"v1"}  # the legacy key read as its version


def test_the_recorded_backend_answers_and_interpolates_it(toy):
    from kernel_gym.measure.recorded import RecordedBackend

    family, model, snap = toy
    b = RecordedBackend(snap)
    w8, w16 = toy_family.ToyWorkload(8, 256), toy_family.ToyWorkload(16, 256)
    c = Config(BLOCK=128, num_warps=4)
    assert b.measure(NAME, w8, c).median_ms == pytest.approx(_time_ms(w8, c))
    mid = b.measure(NAME, toy_family.ToyWorkload(11, 256), c)  # between batch 8 and 16: log-time interpolation
    assert mid.ok and _time_ms(w8, c) < mid.median_ms < _time_ms(w16, c)
    assert b.best_measurement(NAME, w16).median_ms == min(_time_ms(w16, x) for x in family.space.valid_configs(w16))


def test_a_dispatch_table_serves_it(toy):
    from kernel_gym.deploy.export import build_table
    from kernel_gym.dispatch.dispatcher import Dispatcher, DispatchTable

    family, model, _ = toy

    def predict(workloads):
        return [Config(BLOCK=128 if w.batch >= 8 else 32, num_warps=4) for w in workloads]

    table = build_table(model, {NAME: (predict, {"policy": "toy"})}, rests_on=False)
    t = table.kernels[NAME]
    assert t.centers == ([1.0, 4.0, 16.0], [256.0]) and t.fixed == {"width": 256, "dtype": "bfloat16"}
    d = Dispatcher(DispatchTable.from_dict(table.to_dict()))
    assert d.choose(NAME, toy_family.ToyWorkload(20, 256))["BLOCK"] == 128
    assert d.choose(NAME, toy_family.ToyWorkload(2, 256))["BLOCK"] == 32
    assert t.invalid_cells() == []


def test_its_env_line_registers_a_trainable_env(toy):
    from kernel_gym.envs import ENV_IDS, ENV_KERNELS, register_envs
    from kernel_gym.measure.recorded import RecordedBackend

    family, model, snap = toy
    assert ENV_KERNELS[ENV_ID] == NAME and ENV_IDS[ENV_ID][1] == {"backend": "recorded", "kernel": NAME}
    register_envs()
    env = gymnasium.make(ENV_ID, backend=RecordedBackend(snap), model=model, obs_jitter=0.5)
    obs, info = env.reset(seed=0)
    assert obs.shape == (3,) and info["action_mask"].any()
    action = int(np.flatnonzero(info["action_mask"])[0])
    _, reward, terminated, _, step = env.step(action)
    assert terminated and 0.0 < reward <= 1.0 and step["workload"] == info["workload"]
