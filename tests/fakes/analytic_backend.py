"""A test backend: an analytic cost model over the real configs of the real knob spaces.

For behaviour tests only (the env's mechanics and whether PPO learns); its times are a smooth made-up function of
knob positions and workload size, never presented as measurements of anything.
"""

from __future__ import annotations

import random
import zlib

from kernel_gym.dispatch.observation import observe
from kernel_gym.kernels import get_family
from kernel_gym.kernels.space import Config
from kernel_gym.measure.types import COMPILE_ERROR, INVALID, OK, Measurement

# Knob values added after the behaviour tests' expectations were set. They are left out of the sampled pool, so the
# pool stays the sample those tests were written against, as a recorded store holds no rows at values added later.
# Without this, decode's 32/64 splits and PRELOAD_PAGES=1 tripled its space and left the 160-config sample without a
# config at the serving env's 64-token NHD pages for some shapes.
LATER_VALUES = {"decode_attention": {"NUM_SPLITS": (32, 64), "PRELOAD_PAGES": (1,), "KV_TMA": (1,)},
                "prefill_attention": {"PACK_GQA": (1,)}, "prefix_prefill": {"PACK_GQA": (1,)}}


class AnalyticBackend:
    """Deterministic: time = base(size) * (1 + sum_i w_i (position of knob i - target_i(workload))^2).

    available_configs: a fixed seeded sample of `sample` configs of the space (valid ones for the workload), like a
    recorded store that measured a sample. About 1 in `fail_every` (config, workload) pairs fails to compile.
    """

    name = "analytic-test"
    deterministic = True

    def __init__(self, sample: int = 160, seed: int = 0, fail_every: int = 29) -> None:
        self.sample, self.seed, self.fail_every = sample, seed, fail_every
        self._pool: dict[str, list[Config]] = {}
        self.calls = 0

    def _configs(self, kernel: str) -> list[Config]:
        if kernel not in self._pool:
            family = get_family(kernel)
            later = LATER_VALUES.get(kernel, {})
            everything = [c for c in family.space.all_configs()
                          if not any(family.space.value(c, k) in v for k, v in later.items())]
            rng = random.Random(self.seed)
            self._pool[kernel] = everything if len(everything) <= self.sample else rng.sample(everything, self.sample)
        return self._pool[kernel]

    def available_configs(self, kernel: str, workload) -> list[Config]:
        space = get_family(kernel).space
        return [c for c in self._configs(kernel) if space.is_valid(c, workload)]

    def time_ms(self, kernel: str, workload, config: Config) -> float:
        obs = observe(workload)
        s = min(1.0, max(0.0, (float(obs[0]) + 1) / 2))
        s2 = min(1.0, max(0.0, (float(obs[1]) + 1) / 2))
        cost = 1.0
        space = get_family(kernel).space
        for i, knob in enumerate(space.knobs):
            n = len(knob.values)
            p = knob.values.index(space.value(config, knob.name)) / (n - 1) if n > 1 else 0.0
            target = (s, 1 - s, s2)[i % 3]
            cost += (p - target) ** 2 / (1 + 0.3 * i)
        return 0.01 * 2 ** (4 * s) * cost

    def measure(self, kernel: str, workload, config: Config) -> Measurement:
        self.calls += 1
        family = get_family(kernel)
        reason = family.space.why_invalid(config, workload)
        if reason:
            return Measurement(kernel, workload.key(), str(config), INVALID, reason=reason, source=self.name)
        h = zlib.crc32(f"{config}|{workload.key()}".encode())
        if self.fail_every and h % self.fail_every == 0 and config != family.default_config(workload):
            return Measurement(
                kernel, workload.key(), str(config), COMPILE_ERROR, reason="injected test failure", source=self.name
            )
        t = self.time_ms(kernel, workload, config)
        return Measurement(
            kernel, workload.key(), str(config), OK, median_ms=t, spread=0.0, repeats=1, source=self.name
        )
