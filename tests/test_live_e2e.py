"""benchmarks/live_e2e/run.py's CPU pieces: the whole serving path under the interpreter (eager and through the
padded static buffers a CUDA graph replays), the calibrated step overheads, the step fits, and the committed summary's
shape."""

import datetime
import json
import os
from pathlib import Path

import pytest

from benchmarks.live_e2e import run as le

SUMMARY = Path(__file__).resolve().parents[1] / "benchmarks" / "live_e2e" / "summary.json"


def test_capture_sizes_are_vllms():
    assert [le.capture_size(b) for b in (1, 2, 3, 4, 5, 8, 9, 17, 256)] == [1, 2, 4, 4, 8, 8, 16, 24, 256]


@pytest.mark.parametrize("graphs", ["on", "off"])
def test_smoke_serves_every_request_with_checked_attention(tmp_path, graphs):
    """The tiny model's dry run: every request finishes and every attention row of layer 0 matches torch attention
    over the keys gathered back through the page lists; with graphs on, decode-only steps go through the padded
    static buffers of a full graph and steps with chunks through the piecewise pieces (scratch-page rows included),
    and still check out."""
    assert le.main(["--out", str(tmp_path), "--smoke", "--graphs", graphs]) == 0
    got = json.loads((tmp_path / "measured.json").read_text())
    row = got["measured"]["default"]
    assert got["meta"]["cuda_graphs"] is (graphs == "on")
    assert got["meta"]["host"]["cores"] == os.cpu_count()  # the host that issued the kernels (host_issue.py)
    assert row["complete"] and row["finished"] == row["requests"] == le.SMOKE_REQUESTS
    assert row["attention_rows_checked"] >= 300 and row["config_fallbacks"] == 0
    issue = row["host_issue_calibration"]  # measured before the replay through the eager path, graphs on or off
    assert issue["steps"] >= le.ISSUE_MIX_REPEATS - 1 and issue["per_layer_s"] > 0  # the mixed passes' eager steps
    assert issue["p10_p90_s"][0] <= issue["per_layer_s"] <= issue["p10_p90_s"][1]
    assert issue["single_chunk"]["steps"] == le.ISSUE_CALIBRATION_STEPS and issue["single_chunk"]["per_layer_s"] > 0
    ended = datetime.datetime.strptime(row["ended_at"], "%Y/%m/%d %H:%M:%S.%f")  # nvidia-smi's format
    assert abs((datetime.datetime.now() - ended).total_seconds()) < 600
    steps = json.loads((tmp_path / "default_steps.json").read_text())
    graph_steps = [r for r in steps if "graph_rows" in r]
    assert row["graph_steps"] == len(graph_steps)
    piecewise = [r for r in steps if "piecewise_rows" in r]
    if graphs == "on":
        assert graph_steps and all(r["graph_rows"] >= r["decode_batch"] and not r["chunks"] for r in graph_steps)
        assert piecewise and all(r["piecewise_rows"] >= r["tokens"] and r["chunks"] for r in piecewise)
        assert len(graph_steps) + len(piecewise) == len(steps)  # the smoke's steps are all small enough
    else:
        assert not graph_steps and not piecewise
        # every step eager: --predict floors each at the policy's host calibration x layers, not another run's
        assert le.main(["--out", str(tmp_path), "--predict", "--smoke"]) == 0
        pred = json.loads((tmp_path / "summary.json").read_text())["policies"]["default"]
        assert pred["eager_issue"] == {"per_layer_s": issue["per_layer_s"],
                                       "from": "host calibration before the replay"}
        assert pred["host_bound_s"] > 0
        assert le.main(["--out", str(tmp_path), "--predict", "--smoke", "--eager-issue", "none"]) == 0
        off = json.loads((tmp_path / "summary.json").read_text())["policies"]["default"]
        assert off["eager_issue"]["from"] == "none" and off["host_bound_s"] == 0
        assert off["predicted"]["ttft_p50_s"] < pred["predicted"]["ttft_p50_s"]


def test_a_policys_tma_moe_config_is_run_not_replaced():
    """The MoE config a policy picks is checked with the family's own rules (TMA_LOADS included), so a table's TMA
    entry runs as chosen; a config the rules refuse at the exact token count still falls back, counted."""
    from kernel_gym.kernels import fused_moe as fm
    from kernel_gym.traffic.traces import Trace

    tma = fm.FAMILY.space.config({"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4,
                                  "num_stages": 3, "SPLIT_K": 1, "FUSE_SILU": 1, "FUSE_WEIGHT": 1, "FUSE_SUM": 0,
                                  "TMA_LOADS": 2})

    class Fixed(le.DefaultChooser):
        def __init__(self, moe):
            super().__init__()
            self.moe = moe

        def choose(self, kernel, workload, kv):
            return self.moe if kernel == "fused_moe" else super().choose(kernel, workload, kv)

    stack = le.Stack(le.TINY, 8, 32, "cpu", __import__("torch").float32, 16, max_seqs=4, max_context=64)
    trace = Trace("t", [0.0], [8], [2], "test")
    kw = dict(gpu_memory_bytes=le.TINY.weight_bytes + 1e6, max_num_batched_tokens=32, max_num_seqs=4)
    sim = le.LiveSimulator(le.TINY, trace, Fixed(tma), stack, "float32", **kw)
    assert fm.FAMILY.space.is_valid(tma, fm.MoEWorkload(8, 4, 2, 64, 32, 0.0, "float32"))
    assert sim._moe_config(8, 8)[0] == tma and sim.config_fallbacks == 0
    refused = tma.replace(BLOCK_N=256)  # wider than the layer: refused by the family's rules
    sim = le.LiveSimulator(le.TINY, trace, Fixed(refused), stack, "float32", **kw)
    assert sim._moe_config(8, 8)[0] != refused and sim.config_fallbacks == 1


def test_compile_counter_counts_through_tritons_hook_and_keeps_the_one_before():
    from triton import knobs

    before, seen = knobs.runtime.jit_post_compile_hook, []
    try:
        knobs.runtime.jit_post_compile_hook = lambda *a, **kw: seen.append(kw)
        counter = le.CompileCounter()
        assert counter.available and counter.count == 0
        knobs.runtime.jit_post_compile_hook(key="k", already_compiled=False)
        assert counter.count == 1 and seen == [{"key": "k", "already_compiled": False}]
    finally:
        knobs.runtime.jit_post_compile_hook = before


def test_a_step_that_compiles_in_its_timed_run_is_timed_again():
    """A compile the untimed first run did not trigger (a new integer specialisation) lands in the timed run: the
    step is timed once more and its record says so, so no compile is counted as serving time."""
    from kernel_gym.traffic.traces import Trace

    stack = le.Stack(le.TINY, 8, 32, "cpu", __import__("torch").float32, 16, max_seqs=4, max_context=64)
    trace = Trace("t", [0.0], [8], [3], "test")
    kw = dict(gpu_memory_bytes=le.TINY.weight_bytes + 1e6, max_num_batched_tokens=32, max_num_seqs=4)
    sim = le.LiveSimulator(le.TINY, trace, le.DefaultChooser(), stack, "float32", **kw)
    sim.compiles = type("Counter", (), {"count": 0})()
    timed, plain = [], sim._timed

    def timed_with_a_compile(forward):
        t = plain(forward)
        if not timed:
            sim.compiles.count += 1  # the first timed run compiles
        timed.append(t)
        return t

    sim._timed = timed_with_a_compile
    sim.step()
    assert len(timed) == 2 and sim.record[0]["compiled_in_timed_run"] and sim.record[0]["ran_untimed_first"]
    assert sim.record[0]["seconds"] == timed[1]
    sim.step()
    assert len(timed) == 3 and "compiled_in_timed_run" not in sim.record[1]


def test_fit_overheads_takes_each_kinds_median_left_over_and_never_below_zero():
    """Per kind of step, the fixed cost the kernel table leaves out is the median of measured - priced: an outlier
    step (a compile) does not move it, and a kind the table over-prices gets 0, not a negative cost."""
    priced = [("graph", False, 0.010 + 0.003, 0.010)] * 9 + [("graph", False, 0.9, 0.010)]  # one 0.9 s outlier
    priced += [("piecewise", True, 0.050, 0.040 - d) for d in (0.0, 0.001, 0.002)]
    priced += [("eager", True, 0.100, 0.120)]
    fit = le.fit_overheads(priced)
    assert fit["graph"] == {"overhead_s": pytest.approx(0.003), "steps": 10}
    assert fit["piecewise"]["overhead_s"] == pytest.approx(0.011)
    assert fit["eager"]["overhead_s"] == 0.0
    assert le.fit_overheads([]) == {}


def test_step_check_sums_by_group_and_splits_the_residual_into_fixed_and_per_sequence():
    """Decode-only steps leave 1 ms + 0.2 ms per sequence unpriced, steps with chunks exactly the kind's overhead: the
    residual fit recovers both, the sums compare the price plus the overhead with what was measured, and the price's
    shares by family add up over each group's steps."""
    priced = [("graph", False, 0.020 + 0.002 + 0.001 + 0.0002 * b, 0.020, b,
               {"fused_moe": 0.015, "decode_attention": 0.004, "dense": 0.001}, None) for b in range(1, 33)]
    priced += [("piecewise", True, 0.050 + 0.004, 0.050, b, {"fused_moe": 0.040, "prefix_prefill": 0.010}, None)
               for b in (4, 8, 12)]
    check = le.step_check(priced, {"graph": 0.002, "piecewise": 0.004, "eager": 0.03})
    dec, pre = check["decode_only"], check["with_prefill"]
    assert dec["steps"] == 32 and pre["steps"] == 3
    assert dec["residual_fit"]["fixed_s"] == pytest.approx(0.001)
    assert dec["residual_fit"]["per_sequence_s"] == pytest.approx(0.0002)
    assert pre["residual_fit"]["fixed_s"] == pytest.approx(0.0, abs=1e-12)
    assert pre["sum_error"] == pytest.approx(0.0, abs=1e-12) and dec["sum_error"] < 0
    assert dec["price_shares"] == pytest.approx({"decode_attention": 0.2, "dense": 0.05, "fused_moe": 0.75})
    assert pre["price_shares"] == pytest.approx({"fused_moe": 0.8, "prefix_prefill": 0.2})
    # by decode batch band (the graph capture sizes): the unpriced 1 ms + 0.2 ms per sequence weighs more on small
    # steps; a band holds exactly its batches
    bands = dec["by_decode_batch"]
    assert list(bands) == ["1", "2", "3-4", "5-8", "9-16", "17-24", "25-32"]
    assert [v["steps"] for v in bands.values()] == [1, 1, 2, 4, 8, 8, 8]
    assert bands["1"]["sum_error"] == pytest.approx(0.022 / 0.0232 - 1.0)
    assert all(v["sum_error"] < 0 for v in bands.values()) and pre["by_decode_batch"]["9-16"]["steps"] == 1
    assert le.band_name(129, le.BATCH_BANDS[-1][1]) == "129+" and le.band_name(0, 0) == "0"


def test_kernel_part_names_each_profiled_kernel_by_the_price_part_that_charges_it():
    """kernel_gym's Triton kernels by their JIT names, the routing's torch sorts and top-k by the words in theirs,
    the rest (cuBLAS, norms, copies) dense; the first runs' `kg:*` annotation spans are no kernels."""
    assert le.kernel_part("_gate_up_tma_kernel") == "fused_moe" and le.kernel_part("_silu_mul_kernel") == "fused_moe"
    assert le.kernel_part("_decode_grouped_kernel") == "decode_attention"
    assert le.kernel_part("_combine_splits_kernel") == "decode_attention"
    assert le.kernel_part("_combine_splits") == "prefix_prefill" and le.kernel_part("_prefix_fwd") == "prefix_prefill"
    assert le.kernel_part("void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(...)") == "moe_routing"
    assert le.kernel_part("void at::native::radixSortKVInPlace<-2, -1, 16, 2, long>(...)") == "moe_routing"
    assert le.kernel_part("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_NNT") == "dense"
    assert le.kernel_part("void at::native::reduce_kernel<512, 1, MeanOps>(...)") == "dense"
    assert le.kernel_part("kg:moe") is None
    assert le.parts_us({"kg:moe": 900.0, "_down_kernel": 40.0, "_gate_up_kernel": 60.0, "Memcpy DtoD": 5.0}) == {
        "fused_moe": 100.0, "dense": 5.0}


def test_call_parts_give_a_moe_calls_own_elementwise_kernels_to_the_moe():
    """Between two attention launches, the dense-named kernels after the MoE call's first routing kernel and before
    its last fused-MoE kernel are the call's (its routing and alignment), and so is the cast just before; the router
    projection before it and the residual add after it stay dense ops; the part-by-name fields are unchanged."""
    names = ["nvjet_qkv", "_decode_grouped_kernel", "nvjet_o_proj", "nvjet_router", "direct_copy_kernel_cuda",
             "softmax_warp_forward", "CUDAFunctor_add<long>", "radixSortKVInPlace", "FillFunctor<long>",
             "_gate_up_kernel", "index_elementwise_kernel", "_down_kernel", "CUDAFunctor_add<bf16>", "rsqrt_kernel",
             "_decode_grouped_kernel", "nvjet_o_proj", "softmax_warp_forward", "where_kernel"]
    kernels = [(10.0 * i, 10.0 * i + 5.0, n) for i, n in enumerate(names)]
    parts = [p for _, _, p in le.call_parts(kernels[::-1])]  # any input order: by start
    assert parts == ["dense", "decode_attention", "dense", "dense", "moe_routing", "moe_routing", "moe_routing",
                     "moe_routing", "moe_routing", "fused_moe", "moe_routing", "fused_moe", "dense", "dense",
                     "decode_attention", "dense", "moe_routing", "dense"]  # the last: no fused kernel after it
    by_call = le.part_spans_us(kernels, by_call=True)
    by_name = le.part_spans_us(kernels)
    assert by_call["moe_routing"] == pytest.approx(by_name["moe_routing"] + 4 * 10.0)
    assert by_call["dense"] == pytest.approx(by_name["dense"] - 4 * 10.0)
    assert sum(by_call.values()) == pytest.approx(sum(by_name.values()))


def test_part_spans_add_to_each_part_the_idle_time_before_its_kernels():
    """A replay's timeline: each part gets its kernels' durations plus the gap since the previous kernel ended
    (overlapping kernels add no gap; the first kernel none); annotation spans are no kernels but end nothing either."""
    kernels = [(10.0, 30.0, "_gate_up_kernel"), (0.0, 8.0, "nvjet_sm90_qkv"), (33.0, 40.0, "_down_kernel"),
               (38.0, 45.0, "_decode_grouped_kernel"), (50.0, 51.0, "void at::native::sbtopk::gatherTopK")]
    got = le.part_spans_us(kernels)
    assert got == pytest.approx({"dense": 8.0, "fused_moe": (2 + 20) + (3 + 7), "decode_attention": 7.0,
                                 "moe_routing": 5 + 1})
    # the replay's wall time, first start to last end, plus what kernels overlap (none on one stream; 2 us here)
    assert sum(got.values()) == pytest.approx(51.0 + 2.0)
    assert le.part_spans_us([]) == {}


def test_profile_check_sets_each_parts_measured_kernels_beside_its_price():
    """Two profiled decode-only steps: the MoE's kernels against the fused_moe row, the routing's against its
    charge, the norms and projections against the dense price; the step's time beyond its kernels is the idle share.
    Steps without a profile, or whose profile failed, are left out. Given the policy's kernel time by name, the
    measured parts come from those names instead."""
    prof = {"busy_us": 9000.0, "by_part_us": {"fused_moe": 5600.0, "moe_routing": 400.0, "decode_attention": 1000.0,
                                              "dense": 2000.0}}
    parts = {"fused_moe": 0.005, "moe_routing": 0.0004, "decode_attention": 0.0012, "dense": 0.001}
    priced = [("graph", False, 0.010, 0.0076, 8, parts, prof)] * 2
    priced += [("graph", False, 0.5, 0.0076, 8, parts, None), ("graph", False, 0.5, 0.0076, 8, parts,
                                                               {"error": "RuntimeError: no CUPTI"})]
    check = le.profile_check(priced)
    assert check["steps"] == 2 and check["measured_step_s"] == pytest.approx(0.020)
    assert check["kernel_busy_s"] == pytest.approx(0.018) and check["idle_share"] == pytest.approx(0.1)
    moe, dense = check["parts"]["fused_moe"], check["parts"]["dense"]
    assert moe["measured_s"] == pytest.approx(0.0112) and moe["priced_s"] == pytest.approx(0.010)
    assert moe["priced_over_measured"] == pytest.approx(0.010 / 0.0112)
    assert check["parts"]["moe_routing"]["priced_over_measured"] == pytest.approx(1.0)
    assert dense["measured_s"] == pytest.approx(0.004) and dense["priced_over_measured"] == pytest.approx(0.5)
    assert check["parts"]["decode_attention"]["priced_over_measured"] == pytest.approx(1.2)
    assert "prefix_prefill" not in check["parts"]
    assert le.profile_check(priced[2:]) == {}
    assert le.step_check(priced, dict.fromkeys(le.STEP_KINDS, 0.0))["decode_only"]["profile"] == check
    old = {"busy_us": 9000.0, "by_scope_us": {"moe": 6000.0}}  # the first runs' format: no parts per step
    old_rows = [("graph", False, 0.010, 0.0076, 8, parts, old)] * 2
    assert le.profile_check(old_rows) == {}
    by_name = le.profile_check(old_rows, {"kg:moe": 12000.0, "_gate_up_kernel": 8000.0, "_down_kernel": 4000.0,
                                          "nvjet_sm90_tst": 2000.0})
    assert by_name["kernel_busy_s"] == pytest.approx(0.014) and by_name["idle_share"] == pytest.approx(0.3)
    assert by_name["parts"]["fused_moe"]["priced_over_measured"] == pytest.approx(0.010 / 0.012)
    assert by_name["parts"]["moe_routing"]["measured_s"] == 0.0


def test_step_fit_recovers_fixed_cost_and_slope(tmp_path):
    steps = [{"chunks": [], "decode_batch": b, "tokens": b, "seconds": 0.05 + 0.002 * b} for b in range(1, 30)]
    steps += [{"chunks": [[0, t, 0]], "decode_batch": 0, "tokens": t, "seconds": 0.07 + 1e-4 * t}
              for t in (128, 512, 1024, 4096)]
    (tmp_path / "table_x.json_steps.json").write_text(json.dumps(steps))
    fit = le.step_fit(tmp_path, {"table:x.json": {}})["table:x.json"]
    assert fit["decode_only"]["fixed_s"] == pytest.approx(0.05) and fit["decode_only"]["per_decode_batch_s"] == \
        pytest.approx(0.002)
    assert fit["with_prefill"]["fixed_s"] == pytest.approx(0.07) and fit["with_prefill"]["steps"] == 4


def test_committed_summary_holds_measured_predicted_and_errors_per_policy():
    """The issue's record: per policy, measured and predicted tokens/s, TTFT p50 and TPOT p50 with their relative
    errors, consistent with each other."""
    s = json.loads(SUMMARY.read_text())
    assert len(s["policies"]) >= 3 and s["calibration"]["policy"] in s["policies"]
    for row in s["policies"].values():
        for k in le.METRICS:
            m, p = row["measured"][k], row["predicted"][k]
            assert m > 0 and row["relative_error"][k] == pytest.approx((p - m) / m)
            assert row["calibrated"]["relative_error"][k] == pytest.approx(
                (row["calibrated"]["predicted"][k] - m) / m)


def test_packaged_live_check_is_what_the_committed_runs_give():
    """kernel_gym/data/live_check.json (printed under every replay table) is recomputed from the committed runs'
    summaries: a run re-predicted or added without --live-check fails here."""
    packaged = json.loads(le.LIVE_CHECK.read_text())
    root = Path(__file__).resolve().parents[1]
    assert le.live_check([root / r for r in packaged["runs"]]) == packaged
    lo, hi = packaged["range"]["tokens_per_s"]
    assert lo <= hi and len(packaged["rows"]) >= 3


def test_live_check_refuses_eager_runs_and_the_replay_note_reads_it(tmp_path):
    from kernel_gym.evaluate.replay_report import live_check_note

    run = tmp_path / "run"
    run.mkdir()
    summary = {"meta": {"cuda_graphs": False, "model": "m", "trace": "bundled"}, "policies": {}}
    (run / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(SystemExit, match="not a CUDA-graph run"):
        le.live_check([run])
    summary["meta"]["cuda_graphs"] = True
    summary["policies"] = {"p": {"relative_error": {"tokens_per_s": -0.05, "ttft_p50_s": 0.2, "tpot_p50_s": 0.01}},
                           "cut": {"relative_error": {"tokens_per_s": 0.9, "ttft_p50_s": 0.9, "tpot_p50_s": 0.9},
                                   "measured_run_complete": False}}  # its budget cut it: not comparable
    (run / "summary.json").write_text(json.dumps(summary))
    check = le.live_check([run])
    assert check["range"]["ttft_p50_s"] == [0.2, 0.2]
    assert check["within_target"]["tokens_per_s"] == {"within": 1, "of": 1, "range": [-0.05, -0.05]}
    assert check["within_target"]["ttft_p50_s"]["within"] == 0
    assert check["without_compiles_timed"] == check["within_target"]  # no run timed its compiles
    other = tmp_path / "other"  # a run on another trace is counted apart as well as in the whole
    other.mkdir()
    (other / "summary.json").write_text(json.dumps({**summary, "meta": {**summary["meta"], "trace": "code.csv"},
                                                    "policies": {"q": summary["policies"]["p"]}}))
    both = le.live_check([run, other])
    assert both["by_trace"]["bundled"] == check["within_target"]
    assert both["by_trace"]["code.csv"]["ttft_p50_s"]["of"] == 1
    assert both["within_target"]["tokens_per_s"]["of"] == 2
    summary["policies"]["p"]["measured_compiles_timed"] = True
    (run / "summary.json").write_text(json.dumps(summary))
    assert le.live_check([run])["without_compiles_timed"]["tpot_p50_s"] == {"within": 0, "of": 0, "range": None}
    (tmp_path / "check.json").write_text(json.dumps(check))
    note = live_check_note(tmp_path / "check.json")
    assert "tokens/s -5% to -5%" in note and "TTFT p50 +20% to +20%" in note
    assert "1 policy runs in 1 live replays" in note and "within 5% / 10% / 5% on 1, 0, 1 of 1" in note
    assert "pass --decode-waves" not in note
    off = live_check_note(tmp_path / "check.json", decode_waves=False)
    assert "pass --decode-waves to price it the same way" in off
    assert live_check_note(tmp_path / "absent.json") == ""


class _PagesOnly:
    """The stack's page bookkeeping alone (Stack.ensure_pages, release, release_except), for the scheduling tests."""

    def __init__(self, num_pages: int) -> None:
        self.free, self.pages = list(range(num_pages - 1, -1, -1)), {}

    ensure_pages = le.Stack.ensure_pages
    release = le.Stack.release
    release_except = le.Stack.release_except


def _pages_only_run(sim_class: type, preempt_free: bool) -> int:
    """A pool small enough that long prompts preempt one another; each step does the live stack's page bookkeeping.
    Returns the preemptions."""
    import numpy as np

    from kernel_gym.traffic.traces import Trace

    n = 40
    trace = Trace("preempting", np.linspace(0.0, 0.2, n), np.full(n, 600), np.full(n, 40), "test")
    kw = dict(gpu_memory_bytes=le.pool_memory(le.TINY, 48 * 16 * le.TINY.kv_bytes_per_token / 1e9),
              max_num_batched_tokens=256, max_num_seqs=16)  # 48 pages of 16 tokens; a request needs 40

    class Bookkeeping(sim_class):
        def _step_seconds(self, predicted_s, chunks, dec):
            st = self.stack
            st.release_except({int(r) for r in dec} | set(self.pref) | {r for r, _, _ in chunks})
            for rid, c, o in chunks:
                st.ensure_pages(rid, o + c)
            for rid in dec:
                st.ensure_pages(int(rid), int(self.kv[rid]) + 1)
            return 0.01 + 1e-4 * sum(c for _, c, _ in chunks)

        if not preempt_free:
            def _preempt(self, rid):  # the run before the fix: the stack kept a preempted request's pages
                le.Simulator._preempt(self, rid)

    sim = Bookkeeping(le.TINY, trace, le.DefaultChooser(), None, "float32", True, **kw)
    sim.stack = _PagesOnly(sim.num_pages)
    while sim.step():
        pass
    return sim.num_preemptions


def test_a_preempted_requests_pages_go_back_to_the_stack_at_once():
    """Recompute preemption drops a request's KV; re-admitted in the same step, it must not keep its old pages in the
    stack while the simulator counts them free (a loaded Mixtral window exhausted the stack's pool so)."""
    assert _pages_only_run(le.LiveSimulator, preempt_free=True) > 0
    with pytest.raises(RuntimeError, match="page pool exhausted"):
        _pages_only_run(le.LiveSimulator, preempt_free=False)


def test_predict_policies_prices_a_policy_as_predict_does_and_writes_its_untimed_plan(tmp_path):
    """--predict-policies is --predict without the measurements: the same policy on the same window gets the same
    prediction (the run's summary.json is left alone), and the choices the data cannot time become a collect plan."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(Path(le.__file__).parent / "window4_5ee0534" / "window4", run)
    spec = "vllm-table"
    measured = json.loads((run / "measured.json").read_text())  # --predict below prices this policy alone: each
    measured["measured"] = {spec: measured["measured"][spec]}   # measured policy is priced on its own
    (run / "measured.json").write_text(json.dumps(measured))
    before = (run / "summary.json").read_text()
    assert le.main(["--out", str(run), "--predict-policies", spec, "--predict-json", str(tmp_path / "p.json")]) == 0
    assert (run / "summary.json").read_text() == before
    only = json.loads((tmp_path / "p.json").read_text())["policies"][spec]
    assert (tmp_path / "p_untimed_plan.json").exists()
    assert le.main(["--out", str(run), "--predict"]) == 0
    full = json.loads((run / "summary.json").read_text())["policies"][spec]
    assert only["predicted"] == full["predicted"] and only["fallbacks"] == full["fallbacks"]
    with pytest.raises(SystemExit):
        le.main(["--out", str(run), "--predict-policies", spec])  # no --predict-json: refused, nothing overwritten
    with pytest.raises(SystemExit):  # a calibration belongs to --predict, which compares with measurements
        le.main(["--out", str(run), "--predict-policies", spec, "--predict-json", str(tmp_path / "q.json"),
                 "--calibration-from", str(run / "summary.json")])


def test_a_policys_host_calibration_sets_its_eager_issue_floor():
    """--predict floors a measured policy's eager steps at its own host calibration when the run has one (--eager-issue
    host, the default), at the fitted runs' figure when not or when runs are named, and at nothing with none."""
    from types import SimpleNamespace

    host = SimpleNamespace(eager_issue_s=1.1e-3, eager_issue_host=True)
    cal = {"host_issue_calibration": {"per_layer_s": 2.3e-3, "steps": 8}}
    assert le.policy_issue_s(host, cal) == (2.3e-3, "host calibration before the replay")
    assert le.policy_issue_s(host, {})[0] is None  # the runs' value stays
    failed = {"host_issue_calibration": {"error": "no timed eager chunk step came out of the calibration"}}
    assert le.policy_issue_s(host, failed)[0] is None
    named = SimpleNamespace(eager_issue_s=1.1e-3, eager_issue_host=False)  # --eager-issue RUN: that run's, for all
    assert le.policy_issue_s(named, cal) == (None, "--eager-issue runs")
    assert le.policy_issue_s(SimpleNamespace(eager_issue_s=0.0, eager_issue_host=False), cal) == (None, "none")
    args = le.build_parser().parse_args(["--out", "x", "--predict"])
    note = le.eager_issue_setup(args)
    assert args.eager_issue_host and note["host_calibration_first"] and args.eager_issue_s == note["per_layer_s"]
    args = le.build_parser().parse_args(["--out", "x", "--predict", "--eager-issue", "no/such/run"])
    with pytest.raises(SystemExit, match="no measured.json"):
        le.eager_issue_setup(args)


def test_plan_prints_the_live_checks_error_in_one_line(tmp_path):
    """plan's predicted goodput, TTFT and TPOT are replay figures too: the live check's error goes beside them, with
    the one thing that check never covered (collectives)."""
    from kernel_gym.evaluate.replay_report import LIVE_CHECK, live_check_line

    check = json.loads(LIVE_CHECK.read_text())
    line = live_check_line()
    lo, hi = check["range"]["tpot_p50_s"]
    assert f"{len(check['rows'])} live runs" in line and f"TPOT p50 {100 * lo:+.0f}% to {100 * hi:+.0f}%" in line
    assert "collectives" in line and "mean context" in line and live_check_line(tmp_path / "none.json") == ""
