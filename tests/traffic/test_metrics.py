"""Readers of what deployments record (traffic/metrics.py): one test per input format, with scrapes written here in
the engines' own Prometheus text format (no engine runs on the CPU machines)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from kernel_gym.models import load_model
from kernel_gym.traffic import metrics
from kernel_gym.traffic.routing import topk_load_shares, zipf_popularity

MODEL = load_model("mixtral-8x7b")


def vllm_hist(name: str, bounds: list[float], counts: list[int], total: float, engine: str = "0") -> str:
    """A histogram as vLLM's prometheus_client renders it (cumulative buckets, le as float text, sorted labels)."""
    lines = [f"# HELP {name} Histogram.", f"# TYPE {name} histogram"]
    cum = 0
    for b, c in zip([*bounds, float("inf")], counts):
        cum += c
        le = "+Inf" if b == float("inf") else f"{float(b)}"
        lines.append(f'{name}_bucket{{engine="{engine}",le="{le}",model_name="mistralai/Mixtral-8x7B"}} {float(cum)}')
    lines.append(f'{name}_count{{engine="{engine}",model_name="mistralai/Mixtral-8x7B"}} {float(cum)}')
    lines.append(f'{name}_sum{{engine="{engine}",model_name="mistralai/Mixtral-8x7B"}} {float(total)}')
    return "\n".join(lines)


def vllm_scrape(step_counts: list[int], prompt_counts: list[int], gen_counts: list[int], running: float = 12) -> str:
    steps = vllm_hist("vllm:iteration_tokens_total", list(metrics.VLLM_STEP_BUCKETS), step_counts,
                      sum(c * b for c, b in zip(step_counts, [*metrics.VLLM_STEP_BUCKETS, 16384])))
    lens = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
    prompt = vllm_hist("vllm:request_prompt_tokens", lens, prompt_counts,
                       sum(c * b for c, b in zip(prompt_counts, [*lens, 10000])))
    gen = vllm_hist("vllm:request_generation_tokens", lens, gen_counts,
                    sum(c * b for c, b in zip(gen_counts, [*lens, 10000])))
    gauges = ("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
              "# TYPE vllm:num_requests_running gauge\n"
              f'vllm:num_requests_running{{engine="0",model_name="mistralai/Mixtral-8x7B"}} {float(running)}\n'
              "# TYPE vllm:num_requests_waiting gauge\n"
              'vllm:num_requests_waiting{engine="0",model_name="mistralai/Mixtral-8x7B"} 0.0\n'
              "# HELP python_gc_objects_collected_total Objects collected during gc\n"
              "# TYPE python_gc_objects_collected_total counter\n"
              'python_gc_objects_collected_total{generation="0"} 1234.0\n')
    return "\n".join([gauges, steps, prompt, gen]) + "\n"


def write(path, text, mtime):
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


ZERO14 = [0] * 14


def test_vllm_folder_of_scrapes_gives_deltas_and_m_distribution(tmp_path):
    d = tmp_path / "scrapes"
    d.mkdir()
    a_steps = [5, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    b_steps = [5, 0, 0, 40, 0, 0, 0, 0, 30, 0, 0, 0, 0, 0]  # +30 steps in (16, 32], +30 in (512, 1024]
    prompts = [0] * 9 + [4, 0, 0, 0, 0]
    write(d / "t0.prom", vllm_scrape(a_steps, ZERO14, ZERO14), 1000.0)
    write(d / "t1.prom", vllm_scrape(b_steps, prompts, prompts, running=20), 1600.0)
    prof = metrics.read_traffic([d], MODEL, "vllm")
    assert prof.engine == "vllm" and prof.span_s == pytest.approx(600.0)
    assert prof.steps == pytest.approx(60.0)
    small = sum(w for m, w in prof.m_weights.items() if 16 < m <= 32)
    large = sum(w for m, w in prof.m_weights.items() if 512 < m <= 1024)
    assert small == pytest.approx(0.5) and large == pytest.approx(0.5)
    assert prof.requests == pytest.approx(4.0)
    assert 500 < prof.prompt["p50"] <= 1000
    assert prof.running["mean"] == pytest.approx(16.0)
    assert prof.skew is None  # no expert counts given


def test_vllm_counter_reset_counts_the_later_scrape_whole(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    before = [0, 0, 0, 500, *[0] * 10]
    after = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0]  # the server restarted: counts went down
    write(d / "a.txt", vllm_scrape(before, ZERO14, ZERO14), 10.0)
    write(d / "b.txt", vllm_scrape(after, ZERO14, ZERO14), 20.0)
    prof = metrics.read_traffic([d], MODEL)
    assert prof.steps == pytest.approx(7.0)
    assert all(8192 < m <= 16384 for m in prof.m_weights)


def test_vllm_scrape_without_step_tokens_is_refused_with_the_fix(tmp_path):
    text = vllm_hist("vllm:request_prompt_tokens", [10, 100], [1, 2, 0], 120)
    f = write(tmp_path / "only_prompts.txt", text + "\n", 5.0)
    with pytest.raises(metrics.MetricsError, match="only_prompts.txt.*iteration_tokens_total.*fix"):
        metrics.read_traffic([f], MODEL)


def test_malformed_scrape_line_names_file_and_line(tmp_path):
    f = write(tmp_path / "bad.txt", "# TYPE vllm:x gauge\nvllm:x{engine=\"0\"} twelve\n", 1.0)
    with pytest.raises(metrics.MetricsError, match=r"bad.txt:2:.*not a number"):
        metrics.read_scrape(f)
    g = write(tmp_path / "other.txt", "node_load1 0.5\n", 1.0)
    with pytest.raises(metrics.MetricsError, match="no vllm: or sglang: metrics"):
        metrics.read_scrape(g)


def test_label_values_with_escapes_and_timestamps_parse():
    s = metrics.parse_prometheus('vllm:a{model_name="x,\\"y\\"",le="+Inf"} 3 1700000000000\n')
    assert s[0].labels == (("model_name", 'x,"y"'), ("le", "+Inf")) and s[0].timestamp_ms == 1.7e12


def sglang_scrape(prompt_counts: list[int], gen_counts: list[int], running: float) -> str:
    """SGLang's exposition (sglang/srt/metrics/collector.py names; --collect-tokens-histogram buckets)."""
    def hist(name, bounds, counts):
        out = [f"# HELP {name} Histogram of token length.", f"# TYPE {name} histogram"]
        cum, total = 0, 0.0
        for b, c in zip([*bounds, float("inf")], counts):
            cum += c
            total += c * (b if b != float("inf") else 2 * bounds[-1])
            le = "+Inf" if b == float("inf") else f"{float(b)}"
            out.append(f'{name}_bucket{{le="{le}",model_name="Qwen/Qwen1.5-MoE-A2.7B"}} {float(cum)}')
        out.append(f'{name}_sum{{model_name="Qwen/Qwen1.5-MoE-A2.7B"}} {total}')
        out.append(f'{name}_count{{model_name="Qwen/Qwen1.5-MoE-A2.7B"}} {float(cum)}')
        return "\n".join(out)
    return "\n".join([
        "# HELP sglang:num_running_reqs The number of running requests.", "# TYPE sglang:num_running_reqs gauge",
        f'sglang:num_running_reqs{{model_name="Qwen/Qwen1.5-MoE-A2.7B"}} {float(running)}',
        "# TYPE sglang:num_queue_reqs gauge", 'sglang:num_queue_reqs{model_name="Qwen/Qwen1.5-MoE-A2.7B"} 1.0',
        hist("sglang:prompt_tokens_histogram", [100, 300, 500, 1000, 2000], prompt_counts),
        hist("sglang:generation_tokens_histogram", [100, 300, 500, 1000], gen_counts)]) + "\n"


def test_sglang_scrapes_rebuild_m_through_the_simulator(tmp_path):
    d = tmp_path / "sg"
    d.mkdir()
    write(d / "0.txt", sglang_scrape([0] * 6, [0] * 5, 0), 100.0)
    write(d / "1.txt", sglang_scrape([0, 10, 20, 10, 0, 0], [20, 20, 0, 0, 0], 8), 160.0)
    prof = metrics.read_traffic([d], MODEL, "sglang")
    assert prof.engine == "sglang" and prof.requests == pytest.approx(40)
    assert "simulator" in prof.m_source and any("SGLang exports no per-step" in e for e in prof.estimated)
    assert sum(prof.m_weights.values()) == pytest.approx(1.0)
    assert max(prof.m_weights) >= 100  # prefill chunks of 100-1000-token prompts
    assert 300 < prof.prompt["p50"] <= 500


def test_one_sglang_scrape_has_no_period(tmp_path):
    f = write(tmp_path / "one.txt", sglang_scrape([0, 3, 0, 0, 0, 0], [3, 0, 0, 0, 0], 2), 5.0)
    with pytest.raises(metrics.MetricsError, match="folder of >= 2 scrapes"):
        metrics.read_traffic([f], MODEL)


def test_engine_mismatch_is_named(tmp_path):
    f = write(tmp_path / "v.txt", vllm_scrape([1, *[0] * 13], ZERO14, ZERO14), 5.0)
    with pytest.raises(metrics.MetricsError, match="are vllm metrics, --engine is sglang"):
        metrics.read_traffic([f], MODEL, "sglang")


def test_request_log_profile_uses_the_simulator(tmp_path):
    f = tmp_path / "log.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:00:{i // 4:02d}.{(i % 4) * 25:02d}00000,{200 + 37 * i},{20 + i % 7}" for i in range(120)]
    f.write_text("\n".join(rows) + "\n")
    prof = metrics.read_traffic([f], MODEL, "vllm")
    assert prof.requests == 120 and prof.m_source == "simulator (request log)"
    assert prof.decode["batch_mean"] > 1 and sum(prof.m_weights.values()) == pytest.approx(1.0)
    assert prof.prompt["p50"] == pytest.approx(np.median([200 + 37 * i for i in range(120)]))


def zipf_counts(layers: int, experts: int, top_k: int, skew: float, tokens: int = 100000) -> np.ndarray:
    shares = topk_load_shares(zipf_popularity(experts, skew), top_k)
    return np.array([np.round(shares * tokens * top_k) for _ in range(layers)])


def test_sglang_expert_distribution_pt_dump(tmp_path):
    torch = pytest.importorskip("torch")
    counts = zipf_counts(4, 8, 2, 1.2)
    steps = np.stack([counts / 2, counts / 2])  # [buffered steps, layers, logical experts]
    f = tmp_path / "expert_distribution_recorder_1700000000.0.pt"
    torch.save({"rank": 0, "logical_count": torch.tensor(steps, dtype=torch.int32),
                "average_utilization_rate_over_window": None}, f)
    got = metrics.read_expert_counts(f)
    assert got.shape == (4, 8) and got.sum() == pytest.approx(counts.sum(), rel=1e-3)
    sk = metrics.routing_skew(got, 2)
    assert sk["skew"] == pytest.approx(1.2, abs=0.1)


def test_sglang_expert_distribution_csv(tmp_path):
    f = tmp_path / "expert_distribution_rank0_timestamp1700000000.csv"
    lines = ["layer_id,expert_id,count"] + [f"{la},{e},1000" for la in range(3) for e in range(8)]
    f.write_text("\n".join(lines) + "\n")
    assert metrics.classify(f) == "experts"
    got = metrics.read_expert_counts(f)
    assert got.shape == (3, 8)
    assert metrics.routing_skew(got, 2)["skew"] == pytest.approx(0.0, abs=0.05)
    bad = tmp_path / "bad.csv"
    bad.write_text("layer,expert,n\n0,0,1\n")
    with pytest.raises(metrics.MetricsError, match="lacks"):
        metrics.read_expert_counts(bad)


def test_gzipped_expert_counts_are_read_as_counts(tmp_path):
    """A compressed counts file (counts.json.gz, the CSV as .csv.gz) was classified as a request log; it is counts,
    read through gzip like a compressed scrape."""
    import gzip

    counts = zipf_counts(2, 8, 2, 1.2)
    j = tmp_path / "counts.json.gz"
    j.write_bytes(gzip.compress(json.dumps({"counts": counts.tolist()}).encode()))
    c = tmp_path / "expert_distribution_rank0.csv.gz"
    lines = ["layer_id,expert_id,count"] + [f"{la},{e},1000" for la in range(3) for e in range(8)]
    c.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    assert metrics.classify(j) == metrics.classify(c) == "experts"
    assert np.allclose(metrics.read_expert_counts(j), counts)
    assert metrics.read_expert_counts(c).shape == (3, 8)


def test_vllm_eplb_state_maps_physical_replicas_to_logical_experts(tmp_path):
    logical = zipf_counts(2, 8, 2, 1.2)
    # 10 physical experts: the two hottest replicated, their load split between the replicas
    p2l = [list(range(8)) + [0, 1]] * 2
    phys = np.zeros((2, 10))
    phys[:, :8] = logical
    phys[:, 0], phys[:, 8] = logical[:, 0] / 2, logical[:, 0] / 2
    phys[:, 1], phys[:, 9] = logical[:, 1] / 2, logical[:, 1] / 2
    f = tmp_path / "eplb_state.json"
    f.write_text(json.dumps({"expert_load_window": [phys.tolist()], "physical_to_logical_map": p2l}))
    got = metrics.read_expert_counts(f)
    assert np.allclose(got, logical)
    f2 = tmp_path / "explore_eplb.json"
    stats = [{"layer": i, "logical_load": logical[i].tolist()} for i in range(2)]
    f2.write_text(json.dumps({"per_layer_stats": stats}))
    assert np.allclose(metrics.read_expert_counts(f2), logical)


def test_expert_counts_for_another_model_are_refused(tmp_path):
    f = tmp_path / "counts.json"
    f.write_text(json.dumps({"counts": [[1.0] * 64]}))
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps({"timestamp": i * 100, "input_length": 50, "output_length": 5})
                             for i in range(20)) + "\n")
    with pytest.raises(metrics.MetricsError, match="64 experts, mixtral-8x7b has 8"):
        metrics.read_traffic([log, f], MODEL)


def test_eplb_loads_without_their_map_are_named_as_physical_slots(tmp_path):
    """10 loads for Mixtral's 8 experts: an EPLB state's physical slots (2 redundant replicas) dumped without
    physical_to_logical_map. Said as such, with the map as the fix, not only "another model"."""
    f = tmp_path / "eplb_state.json"
    f.write_text(json.dumps({"total_load": [[1.0] * 10] * 2}))
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps({"timestamp": i * 100, "input_length": 50, "output_length": 5})
                             for i in range(20)) + "\n")
    with pytest.raises(metrics.MetricsError, match="2 redundant replicas.*physical_to_logical_map"):
        metrics.read_traffic([log, f], MODEL)


def test_two_traffic_sources_or_none_are_refused(tmp_path):
    a = write(tmp_path / "a.txt", vllm_scrape([1, *[0] * 13], ZERO14, ZERO14), 1.0)
    b = write(tmp_path / "b.txt", vllm_scrape([2, *[0] * 13], ZERO14, ZERO14), 2.0)
    with pytest.raises(metrics.MetricsError, match="2 traffic sources"):
        metrics.read_traffic([a, b], MODEL)
    with pytest.raises(metrics.MetricsError, match="no such file"):
        metrics.read_traffic([tmp_path / "missing.txt"], MODEL)


def test_profile_round_trips(tmp_path):
    p = metrics.TrafficProfile("vllm", ["x"], 60.0, 10, 100, {1: 0.25, 64: 0.75}, {"p50": 3.0}, {},
                               routing={"skew": 0.6})
    p.save(tmp_path / metrics.PROFILE_FILE)
    q = metrics.load_profile(tmp_path / metrics.PROFILE_FILE)
    assert q == p and q.skew == 0.6
    (tmp_path / "junk.json").write_text('{"format": "other"}')
    with pytest.raises(metrics.MetricsError, match="format"):
        metrics.load_profile(tmp_path / "junk.json")
