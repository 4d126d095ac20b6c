"""Decode attention priced from the batch's own contexts (kernel_gym.traffic.decode_waves): the programs a launch
starts, their list schedule over the GPU's slots, the per-config fit on the timer's times, and the simulator's use
of it; and benchmarks/live_e2e/run.py recovering each recorded step's contexts to price it the same way."""

import copy
import json

import numpy as np
import pytest

from kernel_gym.kernels.decode_attention import FAMILY, program_rounds
from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import DecodeWorkload
from kernel_gym.models import load_model
from kernel_gym.traffic import decode_waves as dw
from kernel_gym.traffic.simulator import Simulator, round_log4
from kernel_gym.traffic.traces import Trace

PER_HEAD = Config(PAGE_SIZE=16, LAYOUT="NHD", NUM_SPLITS=1, BLOCK_N=16, num_warps=4, num_stages=2, GQA_GROUPED=0)
SPLIT4 = Config(PAGE_SIZE=16, LAYOUT="NHD", NUM_SPLITS=4, BLOCK_N=16, num_warps=4, num_stages=2, GQA_GROUPED=1)


def test_program_rounds_follow_the_grid_order_and_the_kernels_split_slices():
    rounds = program_rounds([100, 40], SPLIT4, num_heads=32, num_kv_heads=8)
    assert len(rounds) == 4 * 8  # one round per (split, kv head), the batch within each
    # 100 tokens in 4 splits: slices of ceil(ceil(100 / 4) / 16) x 16 = 32, the last one 4 (one block); 40: 16 each,
    # then 8 (one block) and an empty split
    assert [r[0] for r in rounds[::8]] == [32, 32, 32, 16]
    assert [r[1] for r in rounds[::8]] == [16, 16, 16, 0]
    per_head = program_rounds([100, 40], PER_HEAD, num_heads=32, num_kv_heads=8)
    assert len(per_head) == 32 and per_head[0] == [112, 48]  # whole contexts, rounded up to 16-token blocks


def test_makespan_is_the_longest_program_within_one_wave_and_a_list_schedule_beyond():
    assert dw.makespan([[100, 20, 50]], slots=8) == 100 + dw.PROGRAM_TOKENS
    p = dw.PROGRAM_TOKENS
    # two slots, programs 10, 10, 30 in order: the third starts when the first ends
    assert dw.makespan([[10 - p, 10 - p, 30 - p]], slots=2) == pytest.approx(40)
    # a ragged batch waits for its long sequence's programs: more than the same total spread evenly
    ragged = dw.makespan(program_rounds([4000] + [500] * 15, PER_HEAD, 32, 8), slots=264)
    even = dw.makespan(program_rounds([719] * 16, PER_HEAD, 32, 8), slots=264)
    assert ragged > 1.5 * even


def test_makespan_of_a_large_launch_simulated_on_every_gth_round_stays_close_to_the_exact_schedule():
    rng = np.random.default_rng(0)
    rounds = program_rounds([int(c) for c in rng.integers(16, 4000, 200)], PER_HEAD, 32, 8)  # 6,400 programs
    exact_jobs = dw.MAX_JOBS
    try:
        dw.MAX_JOBS = 10 ** 6
        exact = dw.makespan(rounds, 264)
    finally:
        dw.MAX_JOBS = exact_jobs
    assert dw.makespan(rounds, 264) == pytest.approx(exact, rel=0.05)


def _model_times(slots: int, launch_s: float, token_s: float, cfg: Config = PER_HEAD):
    def time_at(b: int, c: int) -> float:
        wl = DecodeWorkload(32, 8, 128, b, c)
        return launch_s + token_s * dw.makespan(program_rounds(wl.context_lens(), cfg, 32, 8), slots)

    def rounds_at(b: int, c: int) -> list[list[int]]:
        return program_rounds(DecodeWorkload(32, 8, 128, b, c).context_lens(), cfg, 32, 8)

    return time_at, rounds_at


def test_fit_recovers_the_slots_and_line_that_made_the_times():
    time_at, rounds_at = _model_times(264, 6e-6, 1e-7)
    fit = dw.fit(time_at, rounds_at)
    assert fit is not None and fit.median_error < 0.03  # the slot grid steps by 2^(1/4)
    assert 0.8 * 264 <= fit.slots <= 1.25 * 264
    assert fit.token_s == pytest.approx(1e-7, rel=0.1)


def test_fit_refuses_times_the_line_cannot_hold_and_too_few_points():
    _, rounds_at = _model_times(264, 6e-6, 1e-7)
    rng = np.random.default_rng(1)
    noise = {(b, c): float(rng.uniform(1e-5, 1e-2)) for b in dw.FIT_BATCHES for c in dw.FIT_CONTEXTS}
    assert dw.fit(lambda b, c: noise[(b, c)], rounds_at) is None  # no slot count fits random times
    time_at, _ = _model_times(264, 6e-6, 1e-7)
    assert dw.fit(lambda b, c: time_at(b, c) if b <= 2 else None, rounds_at) is None  # two batch sizes only


class _WaveTimer:
    """Times that follow the wave model exactly at the rows' own contexts (what a dataset of such a kernel holds)."""

    def __init__(self, slots: int = 264) -> None:
        self.slots, self.calls = slots, 0

    def time_s(self, kernel: str, wl, cfg) -> float:
        self.calls += 1
        if kernel != "decode_attention":
            return 1e-5
        rounds = program_rounds(wl.context_lens(), cfg, wl.num_heads, wl.num_kv_heads)
        return 6e-6 + 1e-7 * dw.makespan(rounds, self.slots)


class _Chooser:
    """The per-head decode config; any config for the other kernels (the timer prices them flat)."""

    def choose(self, kernel: str, workload, kv) -> Config:
        return PER_HEAD if kernel == "decode_attention" else Config(X=1)


def _sim(decode_waves: bool = True, timer=None, trace=None) -> Simulator:
    model = load_model("mixtral-8x7b")
    trace = trace or Trace("t", np.array([0.0]), np.array([16]), np.array([2]))
    assert FAMILY.space.is_valid(PER_HEAD, DecodeWorkload(model.num_heads, model.num_kv_heads, model.head_dim, 1, 1024))
    return Simulator(model, trace, timer or _WaveTimer(), _Chooser(), decode_waves=decode_waves)


def test_simulator_prices_a_ragged_batch_from_its_contexts_and_the_old_way_without_them():
    contexts = np.array([4000] + [500] * 15)
    mean, longest = float(contexts.mean()), float(contexts.max())
    on, off = _sim(True), _sim(False)
    ragged = on._decode_s(16, mean, longest, [], contexts)
    rounds = program_rounds([int(-(-c // 16) * 16) for c in contexts], PER_HEAD, 32, 8)
    assert ragged == pytest.approx(6e-6 + 1e-7 * dw.makespan(rounds, 264), rel=0.1)  # the fit's slots and line
    assert on.decode_waves_steps == 1 and on.decode_waves_s != 0.0
    assert off._decode_s(16, mean, longest, [], contexts) == off._decode_s(16, mean, longest, [])  # unused when off
    assert off.decode_waves_steps == 0
    # the same batch without its contexts: the mean context's time, no less than the longest sequence alone
    assert on._decode_s(16, mean, longest, []) == pytest.approx(off._decode_s(16, mean, longest, []))
    # the longest-sequence bound alone misses the programs that wait behind the long sequence's
    assert ragged > off._decode_s(16, mean, longest, [])


def test_simulator_keeps_the_old_price_for_a_config_whose_times_do_not_fit():
    class Flat(_WaveTimer):
        def time_s(self, kernel, wl, cfg):
            return 1e-5 * (1 + (wl.batch * 7919 + wl.context_len) % 13)  # times no line through makespans holds

    on, off = _sim(True, Flat()), _sim(False, Flat())
    ctx = np.array([3000, 100, 100, 100])
    assert on._decode_s(4, float(ctx.mean()), 3000.0, [], ctx) == off._decode_s(4, float(ctx.mean()), 3000.0, [])
    assert on.decode_waves_steps == 0 and on._wave_fits[PER_HEAD] is None


def test_a_whole_replay_prices_its_decode_steps_with_the_wave_model():
    rng = np.random.default_rng(0)
    n = 12
    trace = Trace("t", np.sort(rng.uniform(0, 1, n)), rng.integers(100, 3000, n), rng.integers(5, 30, n))
    res = {w: _sim(w, trace=trace).run().summary for w in (True, False)}
    assert res[True]["decode_waves_steps"] > 0 and res[False]["decode_waves_steps"] == 0
    assert res[True]["decode_waves_s"] != 0.0


def test_recorded_steps_get_their_contexts_back_from_the_live_schedule():
    """A committed live run (every step's decode batch, mean and longest context recorded): the schedule driven by
    the recorded seconds holds the same batches, so each step's contexts are recovered; a record that disagrees
    makes the recovery refuse (None) rather than price another batch."""
    from pathlib import Path

    from benchmarks.live_e2e import run as le

    run = Path(le.__file__).parent / "graph_5ebaec4" / "window1_spans"
    meta = json.loads((run / "measured.json").read_text())["meta"]
    model = load_model(meta["model"])
    start, seconds, rate = meta["window"]
    trace = le.window_trace(meta["trace"], start, seconds, rate, meta["max_prompt"], meta["max_output"])
    args = le.build_parser().parse_args(["--out", str(run), "--predict"])
    args.kv_gb, args.max_batched_tokens, args.max_seqs = meta["kv_gb"], meta["max_batched_tokens"], meta["max_seqs"]
    steps = le.read_steps(run, "default")[:200]
    contexts = le.step_contexts(steps, model, trace, args, "bfloat16")
    assert contexts is not None and len(contexts) == len(steps)
    for r, ctx in zip(steps, contexts):
        assert len(ctx) == r["decode_batch"]
        if ctx:
            assert max(ctx) == r["max_context"] and np.mean(ctx) == pytest.approx(r["mean_context"])
    wrong = copy.deepcopy(steps)
    wrong[50]["decode_batch"] += 1
    assert le.step_contexts(wrong, model, trace, args, "bfloat16") is None


def test_replay_with_decode_waves_prices_an_untimed_valid_choice_from_its_own_fit_and_reports_it():
    """On the recorded H200 data: a policy whose split-KV decode config the data cannot time at batch 1 (pruned
    there by the family's search rules, yet valid) is charged the family default's time without the wave model, and
    its own fitted time with it; the replay's metrics and table say how much the model moved and how much of that is
    for untimed choices."""
    import warnings

    from kernel_gym.dispatch.baselines import DefaultPolicy
    from kernel_gym.evaluate import replay
    from kernel_gym.evaluate.replay_report import markdown
    from kernel_gym.measure import make_backend
    from kernel_gym.traffic.routing import UniformRouting
    from kernel_gym.traffic.simulator import KVLayout, OverloadWarning

    model = load_model("mixtral-8x7b")
    split8 = Config(PAGE_SIZE=16, LAYOUT="NHD", NUM_SPLITS=8, BLOCK_N=32, num_warps=4, num_stages=2, GQA_GROUPED=1)

    class Split8(DefaultPolicy):
        name = "split8"

        def choose(self, kernel, workload, kv):
            return split8 if kernel == "decode_attention" else super().choose(kernel, workload, kv)

    backend = make_backend("recorded")  # as the live check prices (no proxies for untimed shapes)
    trace = Trace("one", np.array([0.0]), np.array([400]), np.array([40]))  # one sequence decoding at 400-440 tokens
    runs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OverloadWarning)
        for waves in (False, True):
            runs[waves] = replay.run_policy("split8", Split8(model, KVLayout(16, "NHD")), model, trace,
                                            UniformRouting(model.num_experts, model.top_k), backend,
                                            decode_waves=waves)
    off, on = runs[False].metrics, runs[True].metrics
    assert off["fallbacks"] > 0 and "decode_waves_s" not in off  # untimed at batch 1: the default config charged
    assert on["decode_waves_untimed_s"] > 0 and on["decode_waves_s"] < 0  # its own fit: faster than the default's
    assert on["decode_waves_sibling_configs"] == 0  # it has times of its own: no sibling stands in
    assert on["tuned_kernel_s"] < off["tuned_kernel_s"]
    rep = {"trace": "one", "model": model.name, "policies": {"split8": on}}
    assert "untimed)" in markdown(rep)


def test_an_untimed_choice_is_priced_by_its_nearest_timed_siblings_fit_and_only_an_untimed_one():
    """A guarding chooser served the default for a choice the data cannot time (its KV_TMA and COMBINE knobs on):
    the wave model prices the choice with the fit of its nearest sibling the data does time (one knob away before
    two, whatever their speeds), and names it; where no sibling is timed either, the default's time stands; and a
    config the data times but whose times fit no line keeps no wave price, even after it was once an untimed
    choice (the sibling is for untimed choices only, whatever the order of calls)."""
    choice = Config(dict(SPLIT4, COMBINE=1, KV_TMA=1))
    near, far = Config(dict(SPLIT4, COMBINE=1)), SPLIT4  # one knob away, two knobs away

    class Siblings(_WaveTimer):
        def __init__(self, timed: tuple) -> None:
            super().__init__()
            self.timed = timed

        def time_s(self, kernel, wl, cfg):
            if kernel == "decode_attention" and cfg != PER_HEAD and cfg not in self.timed:
                raise LookupError("untimed")
            return super().time_s(kernel, wl, cfg) * (1.5 if cfg == near else 1.0)

    class Guard(_Chooser):
        last_fallback = {"decode_attention": True}
        last_choice = {"decode_attention": choice}

    contexts = np.array([3000] + [400] * 7)
    mean, longest = float(contexts.mean()), float(contexts.max())
    model = load_model("mixtral-8x7b")
    trace = Trace("t", np.array([0.0]), np.array([16]), np.array([2]))

    def sim(timer) -> Simulator:
        return Simulator(model, trace, timer, Guard(), decode_waves=True)

    both, far_only, none = sim(Siblings((near, far))), sim(Siblings((far,))), sim(Siblings(()))
    rounds = program_rounds([int(-(-c // 16) * 16) for c in contexts], choice, 32, 8)
    priced = both._decode_s(8, mean, longest, [], contexts)
    assert both.decode_waves_siblings == {choice: near}  # the nearer sibling, though the slower one
    assert priced == pytest.approx(both._sibling_fits[near].seconds(rounds))
    assert both.decode_waves_untimed_s == pytest.approx(priced * model.num_layers)
    by_far = far_only._decode_s(8, mean, longest, [], contexts)
    assert far_only.decode_waves_siblings == {choice: far}
    assert by_far == pytest.approx(far_only._sibling_fits[far].seconds(rounds)) and by_far < priced
    default_t = none._decode_s(8, mean, longest, [], contexts)  # no sibling timed: the default's time
    assert none.decode_waves_siblings == {choice: None} and none.decode_waves_untimed_s == 0.0
    key = ("decode_attention", 8, round_log4(mean))
    assert default_t == pytest.approx(none.timer.time_s("decode_attention", none._workload(key), PER_HEAD))

    class Unfit(Siblings):  # the choice has times, but they fit no line; its sibling fits
        def time_s(self, kernel, wl, cfg):
            if cfg == choice:
                return 1e-5 * (1 + (wl.batch * 7919 + wl.context_len) % 13)
            return super().time_s(kernel, wl, cfg)

    unfit = sim(Unfit((far,)))
    assert unfit._waves_s(choice, contexts, untimed=True) is not None  # as an untimed choice: the sibling
    assert unfit._waves_s(choice, contexts) is None  # as a timed config, after that: no wave price, as before


def test_later_knob_siblings_change_only_later_knobs_nearest_first():
    from kernel_gym.kernels.decode_attention import SPACE

    choice = Config(dict(SPLIT4, COMBINE=1, KV_TMA=1))
    sibs = SPACE.later_knob_siblings(choice)
    later = {k.name for k in SPACE.knobs if k.legacy is not None}
    assert len(sibs) == 2 ** 3 - 1 and choice not in sibs and SPLIT4 in sibs
    dist = [sum(SPACE.value(s, k) != SPACE.value(choice, k) for k in later) for s in sibs]
    assert dist == sorted(dist) and dist[0] == 1
    for s in sibs:  # the grid and tiles stay; canonical configs (legacy values left out)
        assert all(s[k] == choice[k] for k in SPLIT4)
        assert s == SPACE.config({k: SPACE.value(s, k) for k in SPACE.names})


def test_sibling_check_prices_each_timed_config_from_its_sibling_on_the_committed_tables(tmp_path):
    from benchmarks.live_e2e import sibling_check

    out = tmp_path / "s.json"
    assert sibling_check.main(["--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = doc["models"]["mixtral-8x7b"]
    assert rows
    for r in rows:
        own, sib = json.loads(r["config"]), json.loads(r["sibling"])
        grid = ("NUM_SPLITS", "BLOCK_N", "GQA_GROUPED", "num_warps", "num_stages", "PAGE_SIZE", "LAYOUT")
        assert all(own[k] == sib[k] for k in grid)
        q = r["sibling_price_over_measured"]
        # every config is timed at one batch's 4 contexts at least (session 67's served-plan part timed one config at
        # batch 4 only before its budget ended)
        assert q["min"] <= q["median"] <= q["max"] and r["points"] >= 4
    with pytest.raises(SystemExit, match="no such file"):
        sibling_check.main(["--tables", str(tmp_path / "absent.json"), "--out", str(out)])
