"""benchmarks/live_e2e/retrained/clock_check.py: the parts that place a live step on the wall clock and on the GPU's
SM clock (a console line's policy end, nvidia-smi's CSV), and the summary of measured / price."""

import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def load():
    spec = importlib.util.spec_from_file_location("clock_check", ROOT / "benchmarks/live_e2e/retrained/clock_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_policy_ends_and_power_samples_are_read_from_the_run_files(tmp_path):
    cc = load()
    log = tmp_path / "window4.log"
    log.write_text("[live_e2e 03:47:20] replaying\n"
                   "[live_e2e 03:48:34] vllm-table: 692.7 tok/s, TTFT p50 124.5 ms, TPOT p50 50.58 ms\n"
                   "[live_e2e 03:49:29] table:a/b.json: 702.4 tok/s, TTFT p50 112.7 ms\n")
    assert cc.policy_ends(log) == {"vllm-table": 3 * 3600 + 48 * 60 + 34, "table:a/b.json": 3 * 3600 + 49 * 60 + 29}
    csv = tmp_path / "power.csv"
    csv.write_text("timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temp, reasons\n"
                   "2026/12/05 03:47:18.500, 345 MHz, 3201 MHz, 79.50 W, 40, 0x1\n"
                   "not a sample\n"
                   "2026/12/05 03:47:19.500, 1965 MHz, 3201 MHz, 600.1 W, 50, 0x4\n")
    t, mhz = cc.power_samples(csv)
    assert np.allclose(t, [3 * 3600 + 47 * 60 + 18.5, 3 * 3600 + 47 * 60 + 19.5]) and list(mhz) == [345.0, 1965.0]
    assert cc.seconds_of_day("2026/12/05 03:48:34.250000") == 3 * 3600 + 48 * 60 + 34.25  # measured.json's ended_at


def test_ratio_summary_reads_measured_over_price():
    cc = load()
    s = cc.ratio_summary(np.array([[1.1, 1.0], [2.2, 2.0], [3.0, 3.0]]))
    assert s["steps"] == 3 and abs(s["median_measured_over_price"] - 1.1) < 1e-9
    assert abs(s["sum_error"] - (6.0 / 6.3 - 1.0)) < 1e-9
    assert cc.ratio_summary(np.zeros((0, 2))) == {"steps": 0}
