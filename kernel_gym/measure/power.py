"""The GPU's clock and power state while it is timed: SM and memory clock, power draw and limit, temperature, and the
active throttle (clock event) reasons. Read-only: nothing here changes clocks, limits or any other setting.

Why: the H200 of these sessions is power-capped (about 700 W); under sustained large-M MoE its SM clock falls from
1,980 to about 1,500 MHz within seconds (throttle reason: software power cap) and one config's time moves by 10-25%.
A time is only comparable with another when both say under which clocks they were taken.

Sources, in order: NVML through ctypes on libnvidia-ml.so.1 (microseconds a query), else one `nvidia-smi
--query-gpu=... --format=csv,noheader,nounits` call per sample (tens of ms), else "unavailable" with the reason (a CPU
machine). `KERNEL_GYM_POWER=nvml|nvidia-smi|off` forces one; `KERNEL_GYM_NVIDIA_SMI` names the nvidia-smi binary.
`PowerMonitor` samples in a background thread (every ~100 ms) around a batch of work and summarises min / median /
max and the throttle reasons seen. Standard library only: this module runs on the GPU machine.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

# NVML clock event ("throttle") reason bits, nvml.h: nvmlClocksEventReason*
THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# The reasons that mean the clock is held below what the load asks for (power or heat), as opposed to idle or settings.
SLOWDOWN_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
QUERY_FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "power.limit", "temperature.gpu")
THROTTLE_FIELDS = ("clocks_throttle_reasons.active", "clocks_event_reasons.active")  # old name, then the newer one
DEFAULT_INTERVAL_S = 0.1


def throttle_names(mask: int) -> list[str]:
    """Names of the reason bits set in `mask` (unknown bits as hex)."""
    names = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_BITS)
    if rest:
        names.append(hex(rest))
    return names


@dataclass(frozen=True)
class PowerSample:
    """One reading. Any field the device does not report is None."""

    t: float  # time.monotonic() when taken
    sm_mhz: float | None
    mem_mhz: float | None
    power_w: float | None
    power_limit_w: float | None
    temp_c: float | None
    throttle: int | None  # NVML clock event reason bit mask


class PowerUnavailable(RuntimeError):
    """No source can read this GPU's state (the message says why and what would make one available)."""


class _NvmlReader:
    source = "nvml"

    def __init__(self, index: int, library: str = "libnvidia-ml.so.1", pci_bus_id: str | None = None) -> None:
        try:
            lib = ctypes.CDLL(library)
        except OSError as e:
            raise PowerUnavailable(f"NVML library {library} not loadable ({e})") from None
        self._lib = lib
        self._check(lib.nvmlInit_v2(), "nvmlInit_v2")
        handle = ctypes.c_void_p()
        by_pci = getattr(lib, "nvmlDeviceGetHandleByPciBusId_v2", None)
        if not (pci_bus_id and by_pci and by_pci(pci_bus_id.encode(), ctypes.byref(handle)) == 0):
            self._check(lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)),
                        f"nvmlDeviceGetHandleByIndex_v2({index})")
        self._handle = handle
        reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons = reasons or getattr(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise PowerUnavailable(f"NVML {what} returned error {rc}")

    def _uint(self, fn_name: str, *args: Any) -> float | None:
        value = ctypes.c_uint()
        fn = getattr(self._lib, fn_name, None)
        if fn is None or fn(self._handle, *args, ctypes.byref(value)) != 0:
            return None
        return float(value.value)

    def read(self) -> PowerSample:
        t = time.monotonic()
        sm = self._uint("nvmlDeviceGetClockInfo", ctypes.c_int(1))  # NVML_CLOCK_SM
        mem = self._uint("nvmlDeviceGetClockInfo", ctypes.c_int(2))  # NVML_CLOCK_MEM
        mw = self._uint("nvmlDeviceGetPowerUsage")
        limit_mw = self._uint("nvmlDeviceGetEnforcedPowerLimit")
        temp = self._uint("nvmlDeviceGetTemperature", ctypes.c_int(0))  # NVML_TEMPERATURE_GPU
        throttle = None
        if self._reasons is not None:
            mask = ctypes.c_ulonglong()
            if self._reasons(self._handle, ctypes.byref(mask)) == 0:
                throttle = int(mask.value)
        return PowerSample(t, sm, mem, None if mw is None else mw / 1000.0,
                           None if limit_mw is None else limit_mw / 1000.0, temp, throttle)

    def close(self) -> None:
        self._lib.nvmlShutdown()


def _parse_number(text: str) -> float | None:
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]", ""


def _parse_mask(text: str) -> int | None:
    text = text.strip()
    try:
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def parse_smi_line(line: str, t: float = 0.0) -> PowerSample:
    """One line of `nvidia-smi --query-gpu=<QUERY_FIELDS>,<throttle field> --format=csv,noheader,nounits`."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != len(QUERY_FIELDS) + 1:
        raise ValueError(f"nvidia-smi line has {len(parts)} fields, expected {len(QUERY_FIELDS) + 1}: {line.strip()!r}")
    sm, mem, power, limit, temp = (_parse_number(p) for p in parts[:5])
    return PowerSample(t, sm, mem, power, limit, temp, _parse_mask(parts[5]))


class _SmiReader:
    source = "nvidia-smi"

    def __init__(self, index: int | str, binary: str | None = None) -> None:
        binary = binary or os.environ.get("KERNEL_GYM_NVIDIA_SMI") or shutil.which("nvidia-smi")
        if not binary:
            raise PowerUnavailable("no nvidia-smi on PATH (set KERNEL_GYM_NVIDIA_SMI to its path)")
        self._binary = binary
        self._index = index  # an NVML index or a PCI bus id: nvidia-smi --id takes either
        last = ""
        for throttle_field in THROTTLE_FIELDS:
            self._fields = ",".join((*QUERY_FIELDS, throttle_field))
            try:
                self.read()
                return
            except PowerUnavailable as e:
                last = str(e)
        raise PowerUnavailable(last)

    def read(self) -> PowerSample:
        t = time.monotonic()
        cmd = [self._binary, f"--id={self._index}", f"--query-gpu={self._fields}", "--format=csv,noheader,nounits"]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PowerUnavailable(f"{self._binary} failed: {e}") from None
        lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
        if out.returncode != 0 or not lines:
            msg = (out.stderr or out.stdout).strip().splitlines()
            raise PowerUnavailable(f"{self._binary} exited {out.returncode}: {msg[0] if msg else 'no output'}")
        try:
            return parse_smi_line(lines[0], t)
        except ValueError as e:
            raise PowerUnavailable(str(e)) from None

    def close(self) -> None:
        pass


def nvml_index(cuda_index: int = 0) -> int:
    """The NVML / nvidia-smi index of CUDA device `cuda_index`, through CUDA_VISIBLE_DEVICES when it lists plain
    indices (NVML ignores that variable; `CUDA_VISIBLE_DEVICES=3` makes cuda:0 the fourth GPU)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda_index < len(visible) and visible[cuda_index].isdigit():
        return int(visible[cuda_index])
    return cuda_index


def cuda_pci_bus_id(cuda_index: int) -> str | None:
    """The PCI bus id ("00000000:19:00.0") of CUDA device `cuda_index` when this process has already imported torch
    and sees that device (the exact NVML match, whatever CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER say); else None.
    Never imports torch itself: this module stays standard-library only."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_available() or cuda_index >= torch.cuda.device_count():
            return None
        p = torch.cuda.get_device_properties(cuda_index)
        return f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
    except (AttributeError, RuntimeError):
        return None


def open_reader(cuda_index: int = 0, source: str | None = None, nvidia_smi: str | None = None) -> Any:
    """A reader with `.source`, `.read() -> PowerSample` and `.close()` for CUDA device `cuda_index` (found by its
    PCI bus id where torch is loaded, else through CUDA_VISIBLE_DEVICES, `nvml_index`); raises PowerUnavailable
    naming why no source works. `source` (or KERNEL_GYM_POWER): "nvml", "nvidia-smi", "off" or None (NVML, then
    nvidia-smi)."""
    source = source or os.environ.get("KERNEL_GYM_POWER") or None
    if source not in (None, "nvml", "nvidia-smi", "off"):
        raise ValueError(f"unknown power source {source!r}: use nvml, nvidia-smi or off (KERNEL_GYM_POWER)")
    if source == "off":
        raise PowerUnavailable("power sampling switched off (KERNEL_GYM_POWER=off)")
    index = nvml_index(cuda_index)
    pci = cuda_pci_bus_id(cuda_index)
    reasons = []
    if source in (None, "nvml"):
        try:
            return _NvmlReader(index, pci_bus_id=pci)
        except PowerUnavailable as e:
            reasons.append(str(e))
    if source in (None, "nvidia-smi"):
        try:
            return _SmiReader(pci or index, nvidia_smi)
        except PowerUnavailable as e:
            reasons.append(str(e))
    raise PowerUnavailable("; ".join(reasons))


def read_once(cuda_index: int = 0, source: str | None = None, nvidia_smi: str | None = None) -> PowerSample | None:
    """One reading, or None where no source works."""
    try:
        reader = open_reader(cuda_index, source, nvidia_smi)
    except PowerUnavailable:
        return None
    try:
        return reader.read()
    except PowerUnavailable:
        return None
    finally:
        reader.close()


def _stats(values: list[float | None]) -> list[float] | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return [min(vals), statistics.median(vals), max(vals)]


@dataclass(frozen=True)
class PowerSummary:
    """The state over an interval: [min, median, max] per quantity (None where never reported), the union of the
    throttle reasons seen and the fraction of samples with a power or thermal slowdown (SLOWDOWN_MASK). With
    `available` False, `reason` says why nothing was read and every other field is empty."""

    available: bool
    source: str = ""
    samples: int = 0
    duration_s: float = 0.0
    sm_mhz: list[float] | None = None
    mem_mhz: list[float] | None = None
    power_w: list[float] | None = None
    power_limit_w: list[float] | None = None
    temp_c: list[float] | None = None
    throttle_mask: int = 0
    throttle_reasons: list[str] = field(default_factory=list)
    slowdown_fraction: float | None = None
    reason: str = ""

    @classmethod
    def unavailable(cls, reason: str) -> PowerSummary:
        return cls(available=False, reason=reason)

    @classmethod
    def of(cls, samples: list[PowerSample], source: str) -> PowerSummary:
        if not samples:
            return cls.unavailable(f"no {source} sample was read")
        masks = [s.throttle for s in samples if s.throttle is not None]
        mask = 0
        for m in masks:
            mask |= m
        slow = sum(1 for m in masks if m & SLOWDOWN_MASK) / len(masks) if masks else None
        return cls(
            available=True, source=source, samples=len(samples), duration_s=round(samples[-1].t - samples[0].t, 3),
            sm_mhz=_stats([s.sm_mhz for s in samples]), mem_mhz=_stats([s.mem_mhz for s in samples]),
            power_w=_stats([s.power_w for s in samples]), power_limit_w=_stats([s.power_limit_w for s in samples]),
            temp_c=_stats([s.temp_c for s in samples]), throttle_mask=mask, throttle_reasons=throttle_names(mask),
            slowdown_fraction=slow,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PowerSummary:
        """Inverse of to_dict; unknown keys are ignored (a newer writer), missing ones take their defaults."""
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "available" not in known:
            raise ValueError(f"power summary {d!r} has no 'available' field: not written by PowerSummary.to_dict")
        return cls(**known)

    def compact(self) -> str:
        """The short JSON stored with each measurement row (Measurement.power, the store's power column):
        {"src", "n", "sm": [min, median, max] MHz, "mem": median MHz, "w": [min, median, max] W, "lim": W,
        "c": [min, max] C, "thr": reason mask, "slow": slowed fraction}, or {"na": reason}."""
        if not self.available:
            return json.dumps({"na": self.reason[:160]}, separators=(",", ":"))

        def r(v: list[float] | None, keep: tuple[int, ...] = (0, 1, 2)) -> Any:
            return None if v is None else [round(v[i], 1) for i in keep]

        d = {"src": self.source, "n": self.samples, "sm": r(self.sm_mhz), "mem": r(self.mem_mhz, (1,)),
             "w": r(self.power_w), "lim": r(self.power_limit_w, (2,)), "c": r(self.temp_c, (0, 2)),
             "thr": self.throttle_mask,
             "slow": None if self.slowdown_fraction is None else round(self.slowdown_fraction, 2)}
        d["mem"] = d["mem"][0] if d["mem"] else None
        d["lim"] = d["lim"][0] if d["lim"] else None
        return json.dumps({k: v for k, v in d.items() if v is not None}, separators=(",", ":"))

    @classmethod
    def from_compact(cls, text: str) -> PowerSummary | None:
        """Inverse of compact() (medians stand in for the min and max compact() leaves out); None for ""."""
        if not text:
            return None
        try:
            d = json.loads(text)
        except json.JSONDecodeError:
            raise ValueError(f"power state {text[:80]!r} is not JSON: written by something other than "
                             "PowerSummary.compact") from None
        if "na" in d:
            return cls.unavailable(str(d["na"]))
        c = d.get("c")
        return cls(available=True, source=d.get("src", ""), samples=int(d.get("n", 0)), sm_mhz=d.get("sm"),
                   mem_mhz=[d["mem"]] * 3 if "mem" in d else None, power_w=d.get("w"),
                   power_limit_w=[d["lim"]] * 3 if "lim" in d else None,
                   temp_c=None if c is None else [c[0], (c[0] + c[1]) / 2, c[1]],
                   throttle_mask=int(d.get("thr", 0)), throttle_reasons=throttle_names(int(d.get("thr", 0))),
                   slowdown_fraction=d.get("slow"))

    def short(self) -> str:
        """A few words for a table cell or a progress line: "1512 MHz 688 W 61 C sw_power_cap", or "-"."""
        if not self.available:
            return "-"
        parts = [f"{self.sm_mhz[1]:.0f} MHz" if self.sm_mhz else "", f"{self.power_w[1]:.0f} W" if self.power_w else "",
                 f"{self.temp_c[2]:.0f} C" if self.temp_c else "",
                 ",".join(r for r in self.throttle_reasons if r != "gpu_idle")]
        return " ".join(x for x in parts if x) or "-"

    def line(self) -> str:
        """One line for a log or a table, e.g.
        `power: SM 1500/1755/1980 MHz, mem 3201 MHz, 612/688/701 W (limit 700 W), 41-58 C, throttle sw_power_cap
        (80% of 34 samples over 3.4 s, nvml)`."""
        if not self.available:
            return f"power: unavailable ({self.reason})"

        def rng(v: list[float] | None, unit: str, fmt: str = "{:.0f}") -> str:
            if v is None:
                return f"? {unit}"
            lo, med, hi = (fmt.format(x) for x in v)
            return f"{med} {unit}" if lo == hi else f"{lo}/{med}/{hi} {unit}"

        parts = [f"SM {rng(self.sm_mhz, 'MHz')}", f"mem {rng(self.mem_mhz, 'MHz')}", rng(self.power_w, "W")]
        if self.power_limit_w is not None:
            parts[-1] += f" (limit {self.power_limit_w[2]:.0f} W)"
        if self.temp_c is not None:
            lo, hi = self.temp_c[0], self.temp_c[2]
            parts.append(f"{lo:.0f} C" if lo == hi else f"{lo:.0f}-{hi:.0f} C")
        reasons = ",".join(self.throttle_reasons) if self.throttle_reasons else "none"
        slow = "" if self.slowdown_fraction is None else f"{self.slowdown_fraction:.0%} slowed, "
        return (f"power: {', '.join(parts)}, throttle {reasons} "
                f"({slow}{self.samples} samples over {self.duration_s:.1f} s, {self.source})")


class PowerMonitor:
    """Context manager sampling the GPU state every `interval_s` in a daemon thread from enter to exit (one sample at
    each end at least); `.summary()` after exit (or during, for the samples so far). Never raises for a missing
    source: the summary is then `available=False` with the reason.

        with PowerMonitor(cuda_index=0) as mon:
            ...  # timed work
        print(mon.summary().line())
    """

    def __init__(self, cuda_index: int = 0, interval_s: float = DEFAULT_INTERVAL_S, source: str | None = None,
                 nvidia_smi: str | None = None, keep: int = 100_000) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.cuda_index, self.interval_s, self._source, self._smi, self._keep = (
            cuda_index, interval_s, source, nvidia_smi, keep)
        self.samples: list[PowerSample] = []
        self._reader: Any = None
        self._error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _take(self) -> None:
        try:
            s = self._reader.read()
        except PowerUnavailable as e:
            self._error = str(e)
            return
        with self._lock:
            if len(self.samples) < self._keep:
                self.samples.append(s)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def __enter__(self) -> PowerMonitor:
        try:
            self._reader = open_reader(self.cuda_index, self._source, self._smi)
        except PowerUnavailable as e:
            self._error = str(e)
            return self
        self._take()
        self._thread = threading.Thread(target=self._loop, name="power-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._reader is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        self._take()
        self._reader.close()

    @property
    def source(self) -> str:
        return getattr(self._reader, "source", "")

    def sample_now(self) -> None:
        """Take one reading at once, where that is cheap (NVML: microseconds; nvidia-smi calls are left to the
        thread), so a short timing window has a reading of its own end."""
        if self._reader is not None and self.source == "nvml":
            self._take()

    def window(self, t0: float, t1: float) -> PowerSummary:
        """The summary of the readings taken in [t0, t1] (monotonic s); for a window shorter than the sampling
        interval, the latest reading before t1 (at most interval_s old)."""
        if self._reader is None:
            return PowerSummary.unavailable(self._error or "not started")
        with self._lock:
            inside = [s for s in self.samples if t0 <= s.t <= t1]
            if not inside:
                before = [s for s in self.samples if s.t <= t1]
                inside = before[-1:]
        if not inside:
            return PowerSummary.unavailable(self._error or "no reading before the window ended")
        return PowerSummary.of(inside, self.source)

    def summary(self) -> PowerSummary:
        if self._reader is None:
            return PowerSummary.unavailable(self._error or "not started")
        with self._lock:
            samples = list(self.samples)
        if not samples:
            return PowerSummary.unavailable(self._error or "no sample read")
        return PowerSummary.of(samples, self.source)


def monitor_summary_line(summary: PowerSummary | dict[str, Any] | str | None) -> str:
    """The one-line string of a summary, of its dict form (JSON results), of its compact form (rows), or of None."""
    if isinstance(summary, str):
        summary = PowerSummary.from_compact(summary)
    if summary is None:
        return "power: not recorded"
    if isinstance(summary, dict):
        summary = PowerSummary.from_dict(summary)
    return summary.line()


def main() -> None:
    """`python -m kernel_gym.measure.power [seconds]`: print the state sampled over a few seconds (default 1)."""
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    with PowerMonitor() as mon:
        time.sleep(seconds)
    print(mon.summary().line())


def power_states(states: list[str]) -> dict[str, Any]:
    """What the ok rows' recorded power states (Measurement.power, issue 24) say: rows with one, the p10 / p50 / p90 of
    their median SM clock and temperature, and the share timed under a power or thermal slowdown. Rows stored before
    the power state was recorded (most of the packaged dataset's) count as not recorded; rows whose timer had no reader
    (no NVML, no nvidia-smi) as unavailable."""
    got = [PowerSummary.from_compact(s) for s in states]
    ok = [p for p in got if p is not None and p.available]

    def q(vals: list[float]) -> list[float] | None:
        if not vals:
            return None
        v = sorted(vals)
        return [v[int(f * (len(v) - 1))] for f in (0.1, 0.5, 0.9)]

    slowed = [p.slowdown_fraction for p in ok if p.slowdown_fraction is not None]
    return {"rows_recorded": len(ok), "rows_unavailable": sum(1 for p in got if p is not None and not p.available),
            "rows_not_recorded": sum(1 for p in got if p is None),
            "sm_mhz_p10_p50_p90": q([p.sm_mhz[1] for p in ok if p.sm_mhz]),
            "temp_c_p10_p50_p90": q([p.temp_c[2] for p in ok if p.temp_c]),
            "share_slowed": sum(1 for f in slowed if f > 0) / len(slowed) if slowed else None}


if __name__ == "__main__":
    main()

