"""benchmarks/recheck/run.py: seeded sampling, the worker re-check, the JSON report and dropping failing rows."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from benchmarks.recheck import run as rs
from kernel_gym.kernels import get_family
from kernel_gym.kernels.workloads import model_workloads
from kernel_gym.measure.store import Context, MeasurementStore, iter_snapshot
from kernel_gym.measure.types import OK, WRONG_RESULT, Measurement
from kernel_gym.models import BUILTIN_MODELS


def _snapshot(tmp_path: Path, rows: list[Measurement], kernel: str = "decode_attention") -> Path:
    ctx = Context("NVIDIA H200", "t", "t", kernel, "h")
    with MeasurementStore(tmp_path / "s.sqlite") as store:
        store.put_many(ctx, rows)
        store.export_snapshot(tmp_path / "s.jsonl.gz")
    return tmp_path / "s.jsonl.gz"


def _rows(n: int) -> list[Measurement]:
    return [Measurement("decode_attention", f'{{"w":{i % 3}}}', f'{{"c":{i}}}', OK, median_ms=1.0 + i, spread=0.01,
                        repeats=3) for i in range(n)]


def test_sample_is_seeded_and_bounded() -> None:
    groups = [(Context("d", "t", "t", "decode_attention", "h"), _rows(40))]
    a = rs.sample_ok_rows(groups, 10, seed=1)["decode_attention"]
    assert len(a) == 10 and a == rs.sample_ok_rows(groups, 10, seed=1)["decode_attention"]
    assert a != rs.sample_ok_rows(groups, 10, seed=2)["decode_attention"]
    assert len(rs.sample_ok_rows(groups, 100, seed=1)["decode_attention"]) == 40


def test_failing_rows_are_reported_and_dropped(tmp_path: Path) -> None:
    rows = _rows(9)
    snap = _snapshot(tmp_path, rows)
    sample = rs.sample_ok_rows(list(iter_snapshot(snap)), 9, seed=0)

    def fake(kernel: str, wkey: str, configs: list[str]) -> list[Measurement]:
        return [Measurement(kernel, wkey, c, WRONG_RESULT if c == '{"c":4}' else OK, reason="output 0: 3 non-finite")
                for c in configs]

    report = rs.recheck(sample, fake, budget_s=60)
    info = report["kernels"]["decode_attention"]
    assert (info["checked"], info["failed"]) == (9, 1) and info["failing"][0]["config"] == '{"c":4}'
    out = tmp_path / "dropped.jsonl.gz"
    assert rs.drop_rows(snap, rs.failing_keys(report), out) == {"kept": 8, "dropped": 1}
    left = [m.config for _, ms in iter_snapshot(out) for m in ms]
    assert len(left) == 8 and '{"c":4}' not in left
    json_path = tmp_path / "r.json"
    json_path.write_text(json.dumps(report))
    assert rs.main(["--snapshot", str(snap), "--drop", str(json_path)]) == 0  # in place
    assert sum(len(ms) for _, ms in iter_snapshot(snap)) == 8
    with gzip.open(snap, "rt") as f:
        assert json.loads(f.readline())["format"] == "kernel_gym-measurements"


def test_real_worker_recheck_on_the_interpreter(tmp_path: Path) -> None:
    fam = get_family("decode_attention")
    wl = model_workloads("decode_attention", BUILTIN_MODELS["mixtral-8x7b"], grid="small", dtype="float16")[0]
    row = Measurement("decode_attention", wl.key(), str(fam.default_config(wl)), OK, median_ms=0.1, spread=0.0,
                      repeats=3)
    measure, close = rs.isolated_measure("cpu")
    try:
        report = rs.recheck({"decode_attention": [row]}, measure, budget_s=120)
    finally:
        close()
    assert report["kernels"]["decode_attention"]["statuses"] == {OK: 1}


def test_drop_with_a_bad_report_is_one_line(tmp_path: Path, capsys) -> None:
    snap = _snapshot(tmp_path, _rows(2))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert rs.main(["--snapshot", str(snap), "--drop", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "bad.json" in err
