"""The measurement record and the backend interface shared by live, recorded and interpreter backends.

Imports only the standard library: this module runs on the GPU machine too.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from kernel_gym.kernels.space import Config

# Status values: "ok" is the only one that carries a time. Everything else is a failure with a reason.
OK = "ok"
INVALID = "invalid"  # rejected by the knob space's rules before compiling
COMPILE_ERROR = "compile_error"  # Triton/PTXAS compile failure (incl. CompileTimeAssertionFailure)
OUT_OF_RESOURCES = "out_of_resources"  # shared memory / registers exceeded at launch
WRONG_RESULT = "wrong_result"  # output differs from the torch reference beyond tolerance
CRASH = "crash"  # the worker process died (illegal address, segfault)
TIMEOUT = "timeout"  # the worker hung past its deadline
OOM = "oom"  # CUDA out of memory
UNAVAILABLE = "unavailable"  # recorded backend: no measurement near enough to answer
FAILURE_STATUSES = (INVALID, COMPILE_ERROR, OUT_OF_RESOURCES, WRONG_RESULT, CRASH, TIMEOUT, OOM, UNAVAILABLE)
# Sources of measured times (that exact workload and config timed on the device). Any other source is an estimate:
# recorded-interpolated, recorded-proxy, recorded-borrowed (measure/coverage.py), a roofline or a test backend.
MEASURED_SOURCES = ("recorded", "live")


def is_estimated(source: str) -> bool:
    """Whether a time with this `Measurement.source` is an estimate rather than a measurement of that workload."""
    return source not in MEASURED_SOURCES


@dataclass(frozen=True)
class Measurement:
    """One (kernel, workload, config) measurement.

    median_ms: median kernel time (None unless status == "ok").
    spread: (p90 - p10) / median of the repeats, a dimensionless noise figure.
    source: "live" | "recorded" | "recorded-interpolated" | "recorded-proxy" | "recorded-borrowed" | "interpreter"
    (is_estimated: every source but "live" and "recorded").
    power: SM clock, power, temperature and throttle reasons read while this config was timed (JSON, compact form of
    measure.power.PowerSummary; PowerSummary.from_compact reads it); "" where not recorded (rows older than issue 24).
    """

    kernel: str
    workload: str  # canonical workload key
    config: str  # canonical config string
    status: str
    median_ms: float | None = None
    spread: float | None = None
    repeats: int = 0
    compile_s: float | None = None
    reason: str = ""
    source: str = "live"
    power: str = ""  # the GPU's clock and power state while timed (measure.power.PowerSummary.compact); "" = unknown

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Backend(Protocol):
    """Answers how long a config takes on a workload. The one way every consumer gets a time."""

    name: str

    def measure(self, kernel: str, workload: Any, config: Config) -> Measurement: ...

    def available_configs(self, kernel: str, workload: Any) -> list[Config]:
        """Configs this backend can answer for the workload (recorded: those with nearby measurements)."""
        ...
