"""Serving simulator, issue 29: the prefix cache from traces with hash_ids (hits, LRU eviction, page conservation),
prefill chunks charged with the prefix_prefill kernel (or the labelled equal-pairs estimate), the overload warning,
and the Mooncake loader keeping hash_ids."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from kernel_gym.kernels.space import Config
from kernel_gym.kernels.workloads import PrefillWorkload, PrefixPrefillWorkload
from kernel_gym.traffic.routing import UniformRouting
from kernel_gym.traffic.simulator import KVLayout, OverloadWarning, Simulator, StaticChooser
from kernel_gym.traffic.traces import MOONCAKE_BLOCK_TOKENS, Trace, TraceError, load_mooncake
from tests.traffic.test_simulator import TINY, AnalyticTimer, chooser, mem_for_tokens

B = 64  # tokens per hash block in these tests


class PrefixTimer(AnalyticTimer):
    """AnalyticTimer that also times prefix_prefill (work = attended pairs) and says so (`answers`)."""

    def __init__(self, answer: bool = True) -> None:
        super().__init__()
        self.answer = answer
        self.prefix_calls: list[PrefixPrefillWorkload] = []

    def answers(self, kernel, workload, config=None) -> bool:
        return self.answer

    def time_s(self, kernel, workload, config) -> float:
        if isinstance(workload, PrefixPrefillWorkload):
            self.prefix_calls.append(workload)
            return 20e-6 + workload.causal_pairs() * 1e-9
        return super().time_s(kernel, workload, config)


def prefix_chooser() -> StaticChooser:
    ch = chooser()
    ch.configs["prefix_prefill"] = Config(PAGE_SIZE=16, LAYOUT="NHD", BLOCK_M=64)
    return ch


def shared_prefix_trace(n: int = 6, gap_s: float = 1.0, prompt: int = 5 * B + 10, out: int = 4) -> Trace:
    """n requests, far apart, whose first 4 blocks are the same (a shared system prompt), then their own blocks."""
    ids = tuple((0, 1, 2, 3, 100 + 2 * i, 101 + 2 * i) for i in range(n))
    return Trace("shared", np.arange(n) * gap_s, np.full(n, prompt), np.full(n, out), hash_ids=ids,
                 hash_block_tokens=B)


def run(trace, timer=None, ch=None, **kw):
    kw.setdefault("gpu_memory_bytes", mem_for_tokens(TINY, 1 << 16))
    sim = Simulator(TINY, trace, timer or AnalyticTimer(), ch or chooser(), UniformRouting(4, 2), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OverloadWarning)
        return sim, sim.run()


def pages_balance(sim: Simulator) -> bool:
    """Every page is free, held by a request or held by a cached block."""
    return sim.free_pages + int(sim.pages.sum()) + sim.cache_pages == sim.num_pages


def test_shared_prefix_is_prefilled_once_and_hits_are_reported():
    tr = shared_prefix_trace()
    sim, res = run(tr)
    _, off = run(tr, prefix_caching=False)
    hit = 4 * B * (len(tr) - 1)  # every later request finds the 4 shared blocks
    assert res.summary["prefix_hit_tokens"] == hit
    assert res.summary["prefix_hit_rate"] == pytest.approx(hit / tr.prompt_tokens.sum())
    assert res.summary["prefill_tokens"] == off.summary["prefill_tokens"] - hit
    assert res.ttft_s[1:].max() < off.ttft_s[1:].min()  # less to prefill
    assert np.array_equal(res.generated_tokens, tr.output_tokens)
    assert "prefix_hit_rate" not in off.summary and pages_balance(sim)


def test_without_hash_ids_the_replay_is_unchanged():
    tr = shared_prefix_trace()
    plain = Trace("plain", tr.arrival_s, tr.prompt_tokens, tr.output_tokens)
    _, a = run(plain)
    _, b = run(tr, prefix_caching=False)
    for k in ("tokens_per_s", "ttft_p50_s", "tpot_p50_s", "prefill_tokens", "steps"):
        assert a.summary[k] == b.summary[k]


def test_a_fully_cached_prompt_still_computes_one_token():
    ids = ((0, 1),) * 2
    tr = Trace("same", [0.0, 5.0], [2 * B, 2 * B], [3, 3], hash_ids=ids, hash_block_tokens=B)
    _, res = run(tr)
    assert res.summary["prefix_hit_tokens"] == B  # the last block is recomputed: its step emits the first token
    assert res.summary["prefill_tokens"] == 2 * B + B


def test_lru_eviction_makes_room_before_any_preemption():
    """A pool of 12 blocks' worth of pages and requests with distinct prefixes: cached blocks must be evicted,
    oldest first, and nobody is preempted for them."""
    n = 12
    ids = tuple(tuple(range(10 * i, 10 * i + 4)) for i in range(n))
    tr = Trace("distinct", np.arange(n) * 1.0, np.full(n, 4 * B), np.full(n, 3), hash_ids=ids, hash_block_tokens=B)
    sim, res = run(tr, gpu_memory_bytes=mem_for_tokens(TINY, 12 * B))
    assert res.summary["prefix_evicted_blocks"] > 0 and res.summary["preemptions"] == 0
    assert res.summary["prefix_cached_blocks_max"] <= 12
    assert pages_balance(sim) and np.array_equal(res.generated_tokens, tr.output_tokens)
    assert 10 * (n - 1) + 3 in sim.refs and 0 not in sim.refs  # the newest chain kept, the oldest evicted


def test_conservation_with_prefix_cache_under_preemption():
    rng = np.random.default_rng(0)
    n = 80
    ids = tuple(tuple([0, 1] + [1000 + 10 * i + j for j in range(int(rng.integers(1, 6)))]) for i in range(n))
    prompt = np.array([len(x) * B - int(rng.integers(0, B)) for x in ids])
    tr = Trace("mix", np.sort(rng.uniform(0, 2.0, n)), prompt, rng.integers(1, 60, n), hash_ids=ids,
               hash_block_tokens=B)
    sim, res = run(tr, gpu_memory_bytes=mem_for_tokens(TINY, 40 * B), max_num_batched_tokens=256)
    assert res.summary["preemptions"] > 0 and res.summary["prefix_hit_tokens"] > 0
    assert np.array_equal(res.generated_tokens, tr.output_tokens)
    assert np.all(res.first_token_s >= res.arrival_s) and pages_balance(sim)
    assert sim.refs and all(r == 0 for r in sim.refs.values())  # nothing references the cache at the end


def test_blocks_smaller_than_a_page_are_cached_a_page_at_a_time():
    """A trace's blocks fill pages whole or a whole number of them fills a page (Bailian's 16-token blocks on
    64-token pages): the engine caches full pages, so a page's prefix is its last block's id and a prompt's partial
    last page is not shared. 64-token blocks on 128-token pages: the 4 shared blocks are 2 shared pages."""
    tr = shared_prefix_trace()
    sim, res = run(tr, ch=chooser(page_size=128), kv_layout=KVLayout(128, "NHD"))
    assert sim.block_tokens == 128 and sim.hashes[0] == (1, 3, 101)
    assert res.summary["prefix_hit_tokens"] == 4 * B * (len(tr) - 1) and pages_balance(sim)
    odd = Trace("odd", tr.arrival_s, tr.prompt_tokens, tr.output_tokens, hash_ids=tr.hash_ids, hash_block_tokens=48)
    with pytest.raises(ValueError, match="do not fill pages of 128"):
        Simulator(TINY, odd, AnalyticTimer(), chooser(page_size=128), UniformRouting(4, 2),
                  kv_layout=KVLayout(128, "NHD"), gpu_memory_bytes=mem_for_tokens(TINY, 1 << 16))


# ---- chunks charged with prefix_prefill ------------------------------------------------------------------------


def long_prompt_trace() -> Trace:
    return Trace("long", [0.0, 0.01], [1000, 300], [5, 5])


def test_prefix_mode_charges_chunks_with_their_prefix():
    timer = PrefixTimer()
    _, res = run(long_prompt_trace(), timer, prefix_chooser(), chunk_attention="prefix", max_num_batched_tokens=256)
    assert timer.prefix_calls and any(max(w.prefix_lens) > 0 for w in timer.prefix_calls)
    for w in timer.prefix_calls:
        assert len(w.chunk_lens) == len(w.prefix_lens) and all(c % 16 == 0 for c in w.chunk_lens)
    assert res.summary["chunk_attention_measured_s"] > 0 and res.summary["chunk_attention_estimated_s"] == 0
    assert res.configs_used["prefix_prefill"] and not res.configs_used["prefill_attention"]


def test_auto_mode_falls_back_to_the_labelled_estimate():
    for timer, ch in ((AnalyticTimer(), chooser()), (PrefixTimer(answer=False), prefix_chooser()),
                      (PrefixTimer(), chooser())):  # no answers / no time / no prefix_prefill config
        _, res = run(long_prompt_trace(), timer, ch, max_num_batched_tokens=256)
        assert res.summary["chunk_attention_measured_s"] == 0 and res.summary["chunk_attention_estimated_s"] > 0
        assert not res.configs_used.get("prefix_prefill")
    _, res = run(long_prompt_trace(), PrefixTimer(), prefix_chooser(), max_num_batched_tokens=256)
    assert res.summary["chunk_attention_measured_s"] > 0 and res.summary["chunk_attention_estimated_s"] == 0


def test_equivalent_mode_is_the_old_charge():
    timer = PrefixTimer()
    _, res = run(long_prompt_trace(), timer, prefix_chooser(), chunk_attention="equivalent",
                 max_num_batched_tokens=256)
    assert not timer.prefix_calls and res.summary["chunk_attention_estimated_s"] > 0
    with pytest.raises(ValueError, match="chunk_attention 'fancy'"):
        Simulator(TINY, long_prompt_trace(), timer, prefix_chooser(), chunk_attention="fancy")


def test_prefix_prefill_config_follows_the_kv_layout():
    ch = prefix_chooser()
    w = PrefixPrefillWorkload(4, 2, 64, (16,), (0,))
    assert ch.choose("prefix_prefill", w, KVLayout(32, "HND"))["PAGE_SIZE"] == 32
    assert ch.choose("prefill_attention", PrefillWorkload(4, 2, 64, (16,)), KVLayout(32, "HND")) == Config(BLOCK_M=64)


# ---- overload warning --------------------------------------------------------------------------------------------


def test_overload_warns_and_a_light_load_does_not():
    n = 400
    heavy = Trace("heavy", np.linspace(0, 2.0, n), np.full(n, 1500), np.full(n, 50))
    sim = Simulator(TINY, heavy, AnalyticTimer(), chooser(), UniformRouting(4, 2),
                    gpu_memory_bytes=mem_for_tokens(TINY, 1 << 20))
    with pytest.warns(OverloadWarning, match="offered load exceeds"):
        res = sim.run()
    assert res.summary["overloaded"] == 1.0 and res.warnings
    light = Trace("light", np.arange(20) * 1.0, np.full(20, 100), np.full(20, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error", OverloadWarning)
        res = Simulator(TINY, light, AnalyticTimer(), chooser(), UniformRouting(4, 2),
                        gpu_memory_bytes=mem_for_tokens(TINY, 1 << 20)).run()
    assert res.summary["overloaded"] == 0.0 and not res.warnings and res.summary["window_utilisation"] < 0.5


# ---- Mooncake hash_ids -----------------------------------------------------------------------------------------


def test_mooncake_loader_keeps_hash_ids_through_dropped_rows_and_slicing(tmp_path):
    f = tmp_path / "m.jsonl"
    recs = [{"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
            {"timestamp": 10, "input_length": 0, "output_length": 5, "hash_ids": [7]},  # dropped: zero tokens
            {"timestamp": 20, "input_length": 600, "output_length": 2, "hash_ids": [0, 2]},
            {"timestamp": 30, "input_length": 50, "output_length": 2}]
    f.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    tr = load_mooncake(f)
    assert tr.hash_ids == ((0, 1), (0, 2), ()) and tr.hash_block_tokens == MOONCAKE_BLOCK_TOKENS == 512
    assert tr.head(2).hash_ids == ((0, 1), (0, 2)) and tr.scale_rate(2.0).hash_ids == tr.hash_ids
    assert tr.window(0.015, 1.0).hash_ids == ((0, 2), ())
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": "abc"}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: hash_ids is not a list of integers"):
        load_mooncake(bad)
    with pytest.raises(ValueError, match="2 hash_ids lists for 1 requests"):
        Trace("x", [0.0], [5], [5], hash_ids=((1,), (2,)), hash_block_tokens=4)


def test_backend_timer_answers_from_the_backend_and_auto_never_asks_the_chooser_without_rows():
    from kernel_gym.measure.types import OK, UNAVAILABLE, Measurement
    from kernel_gym.traffic.simulator import BackendTimer

    class Backend:
        name = "fake"

        def __init__(self, has_prefix: bool) -> None:
            self.has_prefix = has_prefix

        def available_configs(self, kernel, workload):
            return [Config(PAGE_SIZE=16, LAYOUT="NHD", BLOCK_M=64)] if self.has_prefix or kernel != "prefix_prefill" \
                else []

        def measure(self, kernel, workload, config):
            if kernel == "prefix_prefill" and not self.has_prefix:
                return Measurement(kernel, workload.key(), str(config), UNAVAILABLE)
            seconds = PrefixTimer().time_s(kernel, workload, config)
            return Measurement(kernel, workload.key(), str(config), OK, median_ms=seconds * 1e3)

    class NoPrefixChooser(StaticChooser):
        def choose(self, kernel, workload, kv):
            assert kernel != "prefix_prefill", "auto mode asked the chooser although the backend has no rows"
            return super().choose(kernel, workload, kv)

    _, res = run(long_prompt_trace(), BackendTimer(Backend(False)), NoPrefixChooser(chooser().configs),
                 max_num_batched_tokens=256)
    assert res.summary["chunk_attention_measured_s"] == 0 and res.summary["chunk_attention_estimated_s"] > 0
    timer = BackendTimer(Backend(True))
    _, res = run(long_prompt_trace(), timer, prefix_chooser(), max_num_batched_tokens=256)
    assert res.summary["chunk_attention_measured_s"] > 0 and res.summary["chunk_attention_estimated_s"] == 0
    assert timer.answers("prefix_prefill", PrefixPrefillWorkload(4, 2, 64, (16,), (0,)))


def test_a_subclass_can_measure_steps_instead_of_predicting_them():
    """The hook the live replay uses (benchmarks/live_e2e/run.py): the step's duration is whatever _step_seconds
    returns, and it sees the step's chunks and decodes."""
    seen = []

    class Measured(Simulator):
        def _step_seconds(self, predicted_s, chunks, dec):
            seen.append((list(chunks), list(dec), predicted_s))
            return 0.5

    tr = Trace("two", [0.0, 0.0], [40, 20], [3, 2])
    res = Measured(TINY, tr, AnalyticTimer(), chooser(), UniformRouting(4, 2),
                   gpu_memory_bytes=mem_for_tokens(TINY, 1 << 16)).run()
    assert np.allclose(np.diff(res.steps[:, 0]), 0.5) and np.allclose(res.steps[:, 1], 0.5)
    assert seen[0][0] == [(0, 40, 0), (1, 20, 0)] and seen[1][1] == [0, 1] and seen[0][2] > 0
    assert res.ttft_s.tolist() == [0.5, 0.5]


def test_a_bailian_trace_is_read_in_seconds_with_its_own_block_size(tmp_path):
    """Alibaba's Qwen Bailian traces share Mooncake's fields but count seconds and 16-token blocks (chat_id tells
    them apart); read as Mooncake they would replay 1,000 times too fast with blocks 32 times too long. `blksz_N` in
    a file name sets the block size of either format; a file mixing the two is refused."""
    rec = [{"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 521, "output_length": 132,
            "type": "text", "turn": 1, "hash_ids": [1, 2, 3]},
           {"chat_id": 160, "parent_chat_id": 159, "timestamp": 62.5, "input_length": 700, "output_length": 80,
            "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4]}]
    f = tmp_path / "qwen_traceA_blksz_16.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rec) + "\n")
    tr = load_mooncake(f)
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 1.386])
    assert tr.hash_block_tokens == 16 and tr.hash_ids == ((1, 2, 3), (1, 2, 3, 4))
    g = tmp_path / "bailian.jsonl"  # no blksz in the name: Bailian's published 16
    g.write_text(f.read_text())
    assert load_mooncake(g).hash_block_tokens == 16
    m = tmp_path / "mine_blksz_64.jsonl"  # a Mooncake-format file whose name gives its block size
    m.write_text(json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [7]}) + "\n")
    assert load_mooncake(m).hash_block_tokens == 64
    small = tmp_path / "mooncake_like.jsonl"  # 16-token blocks in a file read as Mooncake's 512: caught
    small.write_text(json.dumps({"timestamp": 0, "input_length": 64, "output_length": 2, "hash_ids": [1, 2, 3, 4]})
                     + "\n")
    with pytest.raises(TraceError, match="4 hash_ids for a 64-token prompt.*about 16 tokens.*blksz_16"):
        load_mooncake(small)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(f.read_text() + json.dumps({"timestamp": 70000, "input_length": 5, "output_length": 5}) + "\n")
    with pytest.raises(TraceError, match="a Mooncake record in a Bailian trace"):
        load_mooncake(mixed)
