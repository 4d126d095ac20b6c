"""benchmarks/clocks/run.py's statistics (rank correlation, state comparison, power windows) and timing's warm-up
switches, on the CPU."""

from __future__ import annotations

import pytest

from benchmarks.clocks import run as cs
from kernel_gym.measure import power
from kernel_gym.measure.timing import TimingOptions, keep_hot


def test_kendall_tau():
    assert cs.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert cs.kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert cs.kendall_tau([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    assert cs.kendall_tau([1.0], [2.0]) is None
    with pytest.raises(ValueError, match="paired"):
        cs.kendall_tau([1, 2], [1])


def test_compare_states_ratio_and_winner():
    cfgs = ["ref", "a", "b"]
    cool = {"ref": 1.0, "a": 0.9, "b": 1.2}
    hot = {"ref": 1.1, "a": 1.1, "b": 1.3}  # everything slower; a loses its lead over ref
    out = cs.compare_states(cfgs, "ref", cool, hot)
    assert out["configs"] == 3
    assert out["abs_shift"]["min"] == pytest.approx(1.3 / 1.2 - 1)
    assert out["ratio_shift"]["per_config"]["a"] == pytest.approx((1.1 / 1.1) / (0.9 / 1.0) - 1)
    assert out["winner_a"] == "a" and out["winner_b"] in ("ref", "a")
    assert out["a_winner_regret_in_b"] == pytest.approx(1.0)
    assert cs.compare_states(cfgs, "ref", {}, hot) == {"configs": 0}


def test_window_summary_takes_the_window_or_the_nearest_sample():
    samples = [power.PowerSample(t, 1980 - 100 * t, 3201, 500 + 50 * t, 700, 40 + t, 4 if t > 1 else 0)
               for t in range(5)]
    w = cs.window_summary(samples, 1.5, 3.5, "nvml")
    assert w["samples"] == 2 and w["sm_mhz"] == [1680, 1730, 1780] and w["throttle_reasons"] == ["sw_power_cap"]
    w = cs.window_summary(samples, 0.1, 0.2, "nvml")  # shorter than the sampling interval
    assert w["samples"] == 1 and w["sm_mhz"] == [1980, 1980, 1980]
    assert not cs.window_summary([], 0, 1, "no reader")["available"]


def test_heat_options():
    with pytest.raises(ValueError, match="heat_max_s"):
        TimingOptions(heat_max_s=-1)
    assert keep_hot(TimingOptions(heat_max_s=0)) is None  # off: nothing touches a GPU


def test_keep_hot_env_switch(monkeypatch):
    monkeypatch.setenv("KERNEL_GYM_HEAT", "0")
    assert keep_hot() is None


def test_keep_hot_heats_first_then_only_when_cooled_and_within_its_share(monkeypatch):
    import time as _time

    from kernel_gym.measure import timing

    temps = {"now": 40.0}

    class Reader:
        def read(self):
            return power.PowerSample(_time.monotonic(), 1980, 3201, 300, 700, temps["now"], 0)

    calls = []

    def fake_heat(max_s, device="cuda", reader=None, **kw):
        calls.append(max_s)
        return timing.HeatRecord(heated_s=20.0, temp_start_c=temps["now"], temp_end_c=70.0, plateau=True)

    monkeypatch.setattr(timing, "heat_to_steady", fake_heat)
    monkeypatch.setattr(timing, "_hot", {"reader": Reader()})
    monkeypatch.delenv("KERNEL_GYM_HEAT", raising=False)

    def again():
        timing._hot["checked"] = -1e9  # past the once-a-second limit
        return timing.keep_hot(device="cuda:0")

    assert again() is not None and calls == [30.0]  # never heated in this process: heat
    temps["now"] = 68.0
    assert again() is None  # within HOT_MARGIN_C of the 70 C plateau
    temps["now"] = 60.0
    assert again() is None  # cooled, but 20 s of heating already exceeds a quarter of the time since
    timing._hot["first"] -= 1000
    assert again() is not None and len(calls) == 2  # cooled and within its share: heat again
    assert timing.keep_hot(device="cuda:0") is None  # checked less than a second ago


@pytest.mark.gpu
def test_capture_graph_keeps_the_launch_tensors_alive():
    """The replay closure holds the launch closure, so tensors only the launch held (prepare's workspaces, routing
    ids) are not freed and reused under the graph's raw addresses."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: run `pytest -m gpu` on the GPU machine (README: GPU parts)")
    import gc

    from kernel_gym.measure.timing import capture_graph

    def make():
        a = torch.randn(1 << 20, device="cuda")
        out = torch.empty_like(a)

        def fn():
            torch.mul(a, 2.0, out=out)
            return out

        return fn, a * 2.0, out

    fn, expect, out = make()
    replay = capture_graph(fn)
    del fn
    gc.collect()
    junk = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(32)]  # would take a freed block of `a`
    out.zero_()
    replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expect) and len(junk) == 32
