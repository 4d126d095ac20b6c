"""A replay's untimed choices become a `collect --plan` that, once measured, lets the next replay price them: the
configs go to the stored shapes the answer reads (never to a new shape), and a call outside the grid is counted."""

from __future__ import annotations

import json

from kernel_gym.evaluate.replay import GuardedChooser, write_untimed_plan
from kernel_gym.kernels import fused_moe as fm
from kernel_gym.kernels.workloads import MoEWorkload
from kernel_gym.measure.collect import load_plan_file
from kernel_gym.measure.recorded import RecordedBackend
from kernel_gym.measure.store import PACKAGED_SNAPSHOT, load_rows
from kernel_gym.measure.types import OK, Measurement
from kernel_gym.traffic.simulator import KVLayout
from kernel_gym.train.measurement_plans import untimed_plan

KV = KVLayout(16, "NHD")
BETWEEN = MoEWorkload(400, 8, 2, 4096, 14336, 0.0, "bfloat16")  # Mixtral's MoE between two stored token counts


class Fixed:
    def __init__(self, cfg):
        self.cfg = cfg

    def choose(self, kernel, workload, kv):
        return self.cfg


def _unstored_config(backend, corners):
    stored = backend.stored_keys("fused_moe")
    for cfg in fm.FAMILY.space.sample(BETWEEN, 400, seed=3):
        if all((c, str(cfg)) not in stored for c in corners):
            return cfg
    raise AssertionError("every sampled config is stored at a corner")


def test_untimed_choice_is_planned_at_the_bracketing_shapes_and_priced_once_measured(tmp_path):
    backend = RecordedBackend()
    corners = backend.answer_workloads("fused_moe", BETWEEN)
    assert len(corners) == 2 and BETWEEN.key() not in corners  # interpolated between two stored token counts
    cfg = _unstored_config(backend, corners)
    guard = GuardedChooser(Fixed(cfg), backend, num_layers=32)
    assert guard.choose("fused_moe", BETWEEN, KV) != cfg and guard.fallbacks == 1  # untimed: it fell back
    assert guard.last_fallback["fused_moe"]  # the simulator reads this (Simulator._decode_s)

    plan, counts = untimed_plan([guard], backend)
    assert counts == {"calls": 1, "configs": 2, "unbracketed": 0, "workloads": 2, "stored_not_ok": 0}
    assert sorted(e["workload"] for e in plan) == sorted(corners)
    assert all(e["kernel"] == "fused_moe" and e["configs"] == [str(cfg)] for e in plan)
    path = write_untimed_plan([guard, None], backend, tmp_path / "plan.json")
    assert json.loads(path.read_text()) == plan
    assert load_plan_file(str(path), ["fused_moe"])  # collect accepts it: every config valid there

    groups = load_rows(PACKAGED_SNAPSHOT)  # "measure" the plan: the same rows plus the planned ones
    for ctx, rows in groups:
        if ctx == backend.contexts["fused_moe"]:
            rows += [Measurement("fused_moe", w, str(cfg), OK, median_ms=ms, spread=0.0, repeats=5)
                     for w, ms in zip(sorted(corners), (2.0, 8.0))]
    measured = RecordedBackend(groups=groups)
    again = GuardedChooser(Fixed(cfg), measured, num_layers=32)
    assert again.choose("fused_moe", BETWEEN, KV) == cfg and again.fallbacks == 0
    assert again.last_fallback["fused_moe"] is False
    assert 2.0 < again.kernel_s["fused_moe"] / 32 * 1e3 < 8.0  # interpolated between the two measured corners
    assert untimed_plan([again], measured)[0] == []


def test_a_call_outside_the_grid_is_counted_not_planned():
    backend = RecordedBackend()
    far = MoEWorkload(1 << 22, 8, 2, 4096, 14336, 0.0, "bfloat16")
    assert backend.answer_workloads("fused_moe", far) == []
    guard = GuardedChooser(Fixed(fm.FAMILY.default_config(far)), backend, num_layers=2)
    guard._note_untimed("fused_moe", far, fm.FAMILY.default_config(far))
    plan, counts = untimed_plan([guard], backend)
    assert plan == [] and counts["calls"] == 1 and counts["unbracketed"] == 1
