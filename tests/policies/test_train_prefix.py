"""`kernel-gym train --env-id KernelGym/PrefixPrefill-v0` on the packaged H200 rows, end to end on the CPU: the
learned policy beats the default config on held-out prefix shapes, decided with zero measurements."""

from __future__ import annotations

import pytest

from kernel_gym.train.train import train
from tests.policies.test_train import small_args, store  # noqa: F401  (fixture)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_prefix_prefill_training_on_the_recorded_data_beats_the_default(store):  # noqa: F811
    from kernel_gym.measure import make_backend

    root, _ = store
    args = small_args(root, env_id="KernelGym/PrefixPrefill-v0", total_timesteps=3000, n_steps=64, batch_size=128,
                      eval_freq=0, checkpoint_freq=0, checkpoint_dir=str(root / "prefix"), log_model=False)
    result = train(args, backend=make_backend("recorded"))
    e = result.evaluation
    assert e.num_workloads >= 8 and e.policy_failures == 0
    assert e.geomean_policy > e.geomean_default + 0.05
    assert e.geomean_policy > result.metrics["final/random_policy_geomean"]
