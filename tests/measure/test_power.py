"""power.py against a fake nvidia-smi (a script that answers the query like the real one): parsing, the monitor's
summary, the fallbacks when nothing can be read, and the stored dict form."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from pathlib import Path

import pytest

from kernel_gym.measure import power
from kernel_gym.measure.power import PowerMonitor, PowerSummary

FAKE = """#!{python}
import sys, pathlib
args = sys.argv[1:]
log = pathlib.Path({log!r})
with log.open("a") as f:
    f.write(" ".join(args) + "\\n")
query = [a for a in args if a.startswith("--query-gpu=")][0]
if {reject_old} and "clocks_throttle_reasons" in query:
    print('Field "clocks_throttle_reasons.active" is not a valid field to query.', file=sys.stderr)
    sys.exit(2)
lines = pathlib.Path({lines!r}).read_text().splitlines()
n = sum(1 for _ in log.open())
print(lines[min(n - 1, len(lines) - 1)])
"""


def make_fake(tmp_path: Path, lines: list[str], reject_old: bool = False) -> tuple[str, Path]:
    log = tmp_path / "calls.log"
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(lines) + "\n")
    script = tmp_path / "nvidia-smi"
    script.write_text(FAKE.format(python=sys.executable, log=str(log), lines=str(data), reject_old=reject_old))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), log


@pytest.fixture(autouse=True)
def _only_fake(monkeypatch):
    monkeypatch.delenv("KERNEL_GYM_POWER", raising=False)
    monkeypatch.delenv("KERNEL_GYM_NVIDIA_SMI", raising=False)


def test_parse_line_with_missing_fields_and_hex_mask():
    s = power.parse_smi_line("1500, 3201, 688.12, 700.00, 57, 0x0000000000000004", t=1.0)
    assert (s.sm_mhz, s.mem_mhz, s.power_w, s.power_limit_w, s.temp_c, s.throttle) == (1500, 3201, 688.12, 700, 57, 4)
    s = power.parse_smi_line("1980, [N/A], [Not Supported], 700, 35, 0x1")
    assert s.mem_mhz is None and s.power_w is None and s.throttle == 1
    with pytest.raises(ValueError, match="expected 6"):
        power.parse_smi_line("1980, 3201")


def test_throttle_names():
    assert power.throttle_names(0x4 | 0x1) == ["gpu_idle", "sw_power_cap"]
    assert power.throttle_names(0) == []
    assert power.throttle_names(0x1000) == ["0x1000"]


def test_monitor_summarises_fake_nvidia_smi(tmp_path):
    lines = ["1, 1, 1, 1, 1, 0x80",  # the reader's opening check (call 1): never a sample
             "1980, 3201, 120.5, 700.00, 35, 0x0000000000000000",
             "1755, 3201, 650.0, 700.00, 48, 0x0000000000000004",
             "1500, 3201, 699.0, 700.00, 58, 0x0000000000000004"]
    smi, log = make_fake(tmp_path, lines)
    with PowerMonitor(cuda_index=0, interval_s=0.05, source="nvidia-smi", nvidia_smi=smi) as mon:
        deadline = time.monotonic() + 4
        while len(mon.samples) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    s = mon.summary()
    assert s.available and s.source == "nvidia-smi" and s.samples >= 4
    assert s.sm_mhz[0] == 1500 and s.sm_mhz[2] == 1980
    assert s.power_w[2] == 699.0 and s.power_limit_w == [700.0, 700.0, 700.0]
    assert s.temp_c[0] == 35 and s.temp_c[2] == 58
    assert s.throttle_reasons == ["sw_power_cap"] and s.throttle_mask == 4
    assert 0.5 <= s.slowdown_fraction < 1  # every sample after the first two is the last, throttled, line
    line = s.line()
    assert "SM 1500/" in line and "/1980 MHz" in line and "throttle sw_power_cap" in line and "limit 700 W" in line
    calls = log.read_text().splitlines()
    assert all("--id=0" in c and "--format=csv,noheader,nounits" in c for c in calls)
    assert all("clocks.sm,clocks.mem,power.draw,power.limit,temperature.gpu" in c for c in calls)


def test_newer_nvidia_smi_field_name(tmp_path):
    smi, log = make_fake(tmp_path, ["1980, 3201, 100, 700, 30, 0x1"], reject_old=True)
    reader = power.open_reader(0, source="nvidia-smi", nvidia_smi=smi)
    assert reader.read().throttle == 1
    assert "clocks_event_reasons.active" in log.read_text().splitlines()[-1]


def test_cuda_visible_devices_maps_to_nvml_index(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert power.nvml_index(0) == 3 and power.nvml_index(1) == 5
    smi, log = make_fake(tmp_path, ["1980, 3201, 100, 700, 30, 0x0"])
    assert power.read_once(1, source="nvidia-smi", nvidia_smi=smi).sm_mhz == 1980
    assert "--id=5" in log.read_text()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc")
    assert power.nvml_index(0) == 0


def test_unavailable_is_graceful(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    with PowerMonitor(source="nvidia-smi") as mon:
        pass
    s = mon.summary()
    assert not s.available and "nvidia-smi" in s.reason
    assert s.line().startswith("power: unavailable (")
    monkeypatch.setenv("KERNEL_GYM_POWER", "off")
    with PowerMonitor() as mon:
        pass
    assert "KERNEL_GYM_POWER=off" in mon.summary().reason
    assert power.read_once() is None


def test_failing_nvidia_smi_names_its_error(tmp_path):
    bad = tmp_path / "nvidia-smi"
    bad.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
                   "exit 9\n")
    bad.chmod(0o755)
    with pytest.raises(power.PowerUnavailable, match="exited 9: NVIDIA-SMI has failed"):
        power.open_reader(source="nvidia-smi", nvidia_smi=str(bad))


def test_bad_source_name():
    with pytest.raises(ValueError, match="unknown power source 'nvsmi'"):
        power.open_reader(source="nvsmi")


def test_summary_dict_round_trip_and_old_rows():
    samples = [power.PowerSample(0.0, 1980, 3201, 300, 700, 40, 0), power.PowerSample(1.0, 1500, 3201, 699, 700, 60, 4)]
    s = PowerSummary.of(samples, "nvml")
    assert s.slowdown_fraction == 0.5 and s.duration_s == 1.0 and s.sm_mhz == [1500, 1740, 1980]
    d = s.to_dict()
    assert PowerSummary.from_dict({**d, "future_field": 1}) == s
    assert power.monitor_summary_line(d) == s.line()
    assert power.monitor_summary_line(None) == "power: not recorded"
    with pytest.raises(ValueError, match="no 'available' field"):
        PowerSummary.from_dict({"sm_mhz": [1, 2, 3]})


@pytest.mark.skipif(not os.path.exists("/dev/nvidiactl"), reason="needs an NVIDIA driver")
@pytest.mark.parametrize("source", ["nvml", "nvidia-smi"])
def test_real_device_reads_something(source):
    """On the GPU machine: both sources read a plausible state of GPU 0, and agree on the power limit."""
    if source == "nvidia-smi" and not shutil.which("nvidia-smi"):
        pytest.skip("no nvidia-smi on PATH")
    s = power.read_once(0, source=source)
    assert s is not None and s.sm_mhz and s.sm_mhz > 0 and s.mem_mhz and s.mem_mhz > 0
    assert s.power_w and s.power_w > 0 and s.power_limit_w and 100 < s.power_limit_w < 2000
    assert s.temp_c and 0 < s.temp_c < 120 and s.throttle is not None


def test_compact_form_round_trip():
    samples = [power.PowerSample(0.0, 1500, 3201, 690, 700, 60, 4), power.PowerSample(0.1, 1520, 3201, 695, 700, 61, 4)]
    s = PowerSummary.of(samples, "nvml")
    text = s.compact()
    assert len(text) < 140 and '"thr":4' in text
    back = PowerSummary.from_compact(text)
    assert back.sm_mhz == [1500, 1510, 1520] and back.throttle_reasons == ["sw_power_cap"] and back.samples == 2
    assert back.power_limit_w[2] == 700 and back.temp_c[0] == 60 and back.temp_c[2] == 61
    assert power.monitor_summary_line(text).startswith("power: SM 1500/1510/1520 MHz")
    na = PowerSummary.unavailable("no nvidia-smi").compact()
    assert PowerSummary.from_compact(na).reason == "no nvidia-smi"
    assert PowerSummary.from_compact("") is None and power.monitor_summary_line("") == "power: not recorded"
    with pytest.raises(ValueError, match="not JSON"):
        PowerSummary.from_compact("1500 MHz")


def test_monitor_window_takes_the_last_reading_before_a_short_window(tmp_path):
    smi, _ = make_fake(tmp_path, ["1980, 3201, 100, 700, 30, 0x0", "1700, 3201, 650, 700, 50, 0x4"])
    with PowerMonitor(interval_s=0.05, source="nvidia-smi", nvidia_smi=smi) as mon:
        deadline = time.monotonic() + 4
        while len(mon.samples) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        t = time.monotonic()
        w = mon.window(t, t + 0.001)  # no reading inside: the latest one before its end
        mon.sample_now()  # nvidia-smi: left to the thread, adds nothing here
    assert w.available and w.samples == 1 and w.sm_mhz[1] == 1700
    assert not PowerMonitor(source="off").window(0, 1).available


def _ctx():
    from kernel_gym.measure.store import Context

    return Context("NVIDIA H200", "2.11.0", "3.6.0", "fused_moe", "abc")


def test_store_keeps_the_power_state_and_old_files_read(tmp_path):
    import gzip
    import json

    from kernel_gym.kernels.workloads import MoEWorkload
    from kernel_gym.measure import summary
    from kernel_gym.measure.store import ROW_FIELDS, MeasurementStore, iter_snapshot, load_rows
    from kernel_gym.measure.types import Measurement

    wl = MoEWorkload(64, 8, 2, 4096, 14336).key()
    state = PowerSummary.of([power.PowerSample(0.0, 1500, 3201, 690, 700, 60, 4)], "nvml").compact()
    c1, c2, c9 = '{"BLOCK_M":64}', '{"BLOCK_M":128}', '{"BLOCK_M":16}'
    rows = [Measurement("fused_moe", wl, c1, "ok", 1.0, 0.01, 3, power=state),
            Measurement("fused_moe", wl, c2, "ok", 1.2, 0.01, 3)]
    db = tmp_path / "s.sqlite"
    with MeasurementStore(db) as st:
        assert st.put_many(_ctx(), rows) == 2
        assert [r["power"] for r in st.rows(origin=True)] == [state, ""]
        st.export_snapshot(tmp_path / "snap.jsonl.gz")
    assert {m.config: m.power for _, ms in load_rows(db) for m in ms} == {c1: state, c2: ""}
    assert {m.config: m.power for _, ms in iter_snapshot(tmp_path / "snap.jsonl.gz") for m in ms} == {
        c1: state, c2: ""}
    old = tmp_path / "old.jsonl.gz"  # the packaged dataset's format: no power field
    with gzip.open(old, "wt") as f:
        f.write(json.dumps({"format": "kernel_gym-measurements", "version": 1, "fields": ROW_FIELDS}) + "\n")
        f.write(json.dumps({"context": _ctx().__dict__}) + "\n")
        f.write(json.dumps([wl, c9, "ok", 2.0, 0.01, 3, 0.5, "", "live"]) + "\n")
    assert [m.power for _, ms in iter_snapshot(old) for m in ms] == [""]
    info = summary.dataset_summary(db, coverage=False)
    assert info["kernels"]["fused_moe"]["power"]["rows_recorded"] == 1
    assert "power state: 1 of 2 ok rows, SM clock p10/p50/p90 1500/1500/1500 MHz" in summary.format_summary(info)
    assert "power state" not in summary.format_summary(summary.dataset_summary(old, coverage=False))


def test_worker_samples_power_only_when_timing_on_a_gpu():
    from kernel_gym.measure.timing import DEFAULT_TIMING
    from kernel_gym.measure.worker import _start_power

    assert _start_power(None, "cuda") is None
    assert _start_power(DEFAULT_TIMING, "cpu") is None


def test_short_forms_for_tables_and_progress(tmp_path):
    from kernel_gym import bench
    from kernel_gym.measure.collect import _last_clocks
    from kernel_gym.measure.store import MeasurementStore
    from kernel_gym.measure.types import Measurement

    state = PowerSummary.of([power.PowerSample(0.0, 1512, 3201, 688, 700, 61, 0x5)], "nvml").compact()
    assert bench._clocks(state) == "1512 MHz 688 W 61 C sw_power_cap" and bench._clocks("") == "-"
    with MeasurementStore(tmp_path / "s.sqlite") as st:
        assert _last_clocks(st, 0.0) == ""
        st.put_many(_ctx(), [Measurement("fused_moe", "w", "c", "ok", 1.0, 0.0, 3, power=state)])
        assert _last_clocks(st, 0.0) == ", GPU 1512 MHz 688 W 61 C sw_power_cap"


@pytest.mark.gpu
def test_live_rows_carry_the_power_state_and_the_warm_up_heats():
    """On the GPU machine: a live measurement's row says under which clocks it was timed, and heat_to_steady loads the
    GPU (its readings show the temperature it reached)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: run `pytest -m gpu` on the GPU machine (README: GPU parts)")
    from tiny_family import FAMILY, TinyWorkload

    from kernel_gym.kernels.space import Config
    from kernel_gym.measure.live import LiveBackend
    from kernel_gym.measure.timing import TimingOptions, heat_to_steady

    with LiveBackend(timing=TimingOptions(heat_max_s=3.0)) as backend:
        m = backend.measure(FAMILY, TinyWorkload(1 << 20), Config(BLOCK=256))
    assert m.ok, m.reason
    state = PowerSummary.from_compact(m.power)
    if power.read_once() is None:
        assert state is not None and not state.available
        return
    assert state.available and state.sm_mhz[1] > 0 and state.power_w[1] > 0
    rec = heat_to_steady(3.0, reader=power.open_reader(0), min_s=3.0)
    assert rec.heated_s >= 3.0 and len(rec.trace) >= 3 and rec.temp_end_c is not None


def test_pci_bus_id_from_a_loaded_torch_finds_the_device(tmp_path, monkeypatch):
    import sys
    import types

    props = types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x19, pci_device_id=0)
    cuda = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1,
                                 get_device_properties=lambda i: props)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert power.cuda_pci_bus_id(0) == "00000000:19:00.0" and power.cuda_pci_bus_id(1) is None
    smi, log = make_fake(tmp_path, ["1980, 3201, 100, 700, 30, 0x0"])
    assert power.read_once(0, source="nvidia-smi", nvidia_smi=smi).sm_mhz == 1980
    assert "--id=00000000:19:00.0" in log.read_text()
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 1, get_device_properties=lambda i: object())))
    assert power.cuda_pci_bus_id(0) is None  # an older torch without the PCI fields: the index path


def test_what_prices_says_under_which_clocks_its_rows_were_timed():
    """RecordedBackend.describe (written into every replay's results file) carries each kernel's clock summary, and
    counts rows stored before clocks were recorded apart from rows whose timer had no reader."""
    from kernel_gym.kernels.workloads import MoEWorkload
    from kernel_gym.measure.recorded import RecordedBackend
    from kernel_gym.measure.types import Measurement

    capped = PowerSummary.of([power.PowerSample(0.0, 1500, 3201, 690, 700, 60, 4)], "nvml").compact()
    no_reader = PowerSummary.unavailable("no NVML, no nvidia-smi").compact()
    rows = [Measurement("fused_moe", MoEWorkload(t, 8, 2, 64, 96).key(), '{"BLOCK_M":16}', "ok", 0.1 * t, 0.01, 3,
                        power=p) for t, p in ((1, capped), (2, ""), (4, no_reader))]
    b = RecordedBackend(groups=[(_ctx(), rows)], check_validity=False)
    pw = b.describe()["kernels"]["fused_moe"]["power"]
    assert (pw["rows_recorded"], pw["rows_not_recorded"], pw["rows_unavailable"]) == (1, 1, 1)
    assert pw["sm_mhz_p10_p50_p90"] == [1500, 1500, 1500] and pw["share_slowed"] == 1.0
    assert "1 with clocks, SM p50 1500 MHz, 100% slowed" in b.describe_line()
    b.describe()["kernels"]["fused_moe"]["power"]["rows_recorded"] = 99  # a caller's edit leaves the cache alone
    assert b.describe()["kernels"]["fused_moe"]["power"]["rows_recorded"] == 1
