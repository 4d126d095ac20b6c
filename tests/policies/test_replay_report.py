"""The replay table reads on its own: distinct column headings, one footnote line per column, the routing and its
default in the header, and a note beside the ratios when most kernel time rests on estimates."""

from __future__ import annotations

from kernel_gym.evaluate import replay_report


def _policy(tok: float, same: float, est: float) -> dict:
    return {"tokens_per_s": tok, "tuned_kernel_s": same, "tuned_kernel_s_same_traffic": same, "tuning_gpu_s": 0.0,
            "ttft_p50_s": 0.1, "ttft_p99_s": 0.3, "tpot_p50_s": 0.03, "tpot_p99_s": 0.04, "config_switches": 3,
            "fallbacks": 0, "estimated_share": est, "estimated_share.prefill_attention": est,
            "estimated_share.decode_attention": est, "estimated_share.fused_moe": est}


def _report(est: float) -> dict:
    return {"trace": "t", "model": "mixtral-8x7b", "routing": "zipf:1.2", "load": "10 requests over 5 s",
            "policies": {"learned": _policy(90.0, 11.0, est), "vllm-table": _policy(93.0, 10.5, est),
                         "oracle": _policy(100.0, 10.0, est)}}


def test_columns_are_distinct_and_each_is_defined_in_the_footnote() -> None:
    md = replay_report.markdown(_report(0.2))
    header = next(ln for ln in md.splitlines() if ln.startswith("| policy |"))
    heads = [h.strip() for h in header.strip("|").split("|")][1:]
    assert len(heads) == len(set(heads)) == len(replay_report.COLUMNS)
    for h in heads:
        assert f"\n- {h}: " in md, h  # its definition under the table
    row = next(ln for ln in md.splitlines() if ln.startswith("| learned |"))
    assert len(row.strip("|").split("|")) == len(heads) + 1
    assert "| 0.900 |" in row and "| 0.909 |" in row  # tokens/s / oracle, then kernel speed / oracle (10 / 11)
    assert "Expert routing: zipf:1.2 (`--routing`; default zipf:1.2" in md
    assert "Note: most tuned-kernel time" not in md


def test_mostly_estimated_kernel_time_is_flagged_beside_the_ratios() -> None:
    md = replay_report.markdown(_report(0.98))
    assert "Note: most tuned-kernel time here rests on estimates (learned 98%, vllm-table 98%, oracle 98%)" in md


def test_replay_routing_default_is_the_one_the_report_states() -> None:
    from kernel_gym.cli import replay as replay_cli

    args = replay_cli.build_parser().parse_args(["--json", "x.json"])
    assert args.routing == replay_report.DEFAULT_ROUTING == "zipf:1.2"
    assert "default zipf:1.2" in replay_cli.build_parser().format_help().replace("\n", " ").replace("  ", " ")


def test_docs_define_every_column() -> None:
    from pathlib import Path

    doc = (Path(replay_report.__file__).resolve().parents[2] / "docs" / "simulator.md").read_text()
    section = doc[doc.index("## Reading the replay table"):]
    for heading, definition in replay_report.COLUMNS:
        assert f"- **{heading}**: " in section, heading
        assert " ".join(definition.split()[:4]) in section.replace("\n", " "), heading


def test_the_estimate_note_shows_a_short_traces_seconds():
    """A trace of a few requests has under a second of kernel time: the note said "fused_moe: 0 of its 0 s"."""
    from kernel_gym.evaluate.replay_report import estimate_note

    pol = {"estimated_share": 0.52, "tuned_kernel_s": 0.0421, "tuned_kernel_s.fused_moe": 0.03,
           "estimated_share.fused_moe": 0.7}
    note = estimate_note({"policies": {"learned": pol}})
    assert "fused_moe: 0.021 of its 0.0421 s" in note
    pol.update({"tuned_kernel_s": 1070.4, "tuned_kernel_s.fused_moe": 1003.0})
    assert "fused_moe: 702 of its 1,070 s" in estimate_note({"policies": {"learned": pol}})  # not 1.07e+03
