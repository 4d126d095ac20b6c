"""Traffic: trace loaders, synthetic profiles, expert routing profiles, the serving simulator, traffic features."""

from kernel_gym.traffic.features import FEATURE_NAMES, feature_dict, traffic_features
from kernel_gym.traffic.routing import (
    DriftingHotRouting,
    RoutingProfile,
    UniformRouting,
    ZipfRouting,
    effective_skew,
    entropy_norm,
    max_share,
)
from kernel_gym.traffic.simulator import (
    KERNELS,
    BackendTimer,
    ConfigChooser,
    IntervalStats,
    KernelTimer,
    KVLayout,
    SimResult,
    Simulator,
    StaticChooser,
)
from kernel_gym.traffic.synthetic import (
    EmpiricalLengths,
    FixedLengths,
    LogNormalLengths,
    Phase,
    arrival_times,
    diurnal,
    gamma,
    poisson,
    traffic_shift,
)
from kernel_gym.traffic.traces import Trace, TraceError, load_trace

__all__ = [
    "FEATURE_NAMES", "feature_dict", "traffic_features", "DriftingHotRouting",
    "RoutingProfile", "UniformRouting", "ZipfRouting", "effective_skew", "entropy_norm", "max_share", "KERNELS",
    "BackendTimer", "ConfigChooser", "IntervalStats", "KernelTimer", "KVLayout", "SimResult", "Simulator",
    "StaticChooser", "EmpiricalLengths", "FixedLengths", "LogNormalLengths", "Phase", "arrival_times", "diurnal",
    "gamma", "poisson", "traffic_shift", "Trace", "TraceError", "load_trace",
]
