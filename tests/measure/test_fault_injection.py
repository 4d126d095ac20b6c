"""benchmarks/fault_injection/run.py on the CPU interpreter: a hang, an illegal address (a segfault under the
interpreter) and an allocation failure among correct configs are each stored with their reason; the worker restarts;
the rest is ok."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.fault_injection import run as fi
from kernel_gym.measure.types import CRASH, OK, OOM, TIMEOUT


def test_faults_are_stored_with_reasons_and_the_rest_is_ok(tmp_path: Path) -> None:
    assert fi.main(["--device", "cpu", "--hang-timeout-s", "3", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "fault_injection.json").read_text())
    assert report["passed"] and report["restarts"] == 2 and not report["problems"]
    by_mode: dict[str, list[dict]] = {}
    for r in report["rows"]:
        by_mode.setdefault(r["mode"], []).append(r)
    (hang,), (illegal,), (oom,) = by_mode["hang"], by_mode["illegal"], by_mode["oom"]
    assert hang["status"] == TIMEOUT and "no answer within 3 s" in hang["reason"]
    assert illegal["status"] == CRASH and "worker process died" in illegal["reason"]
    assert oom["status"] == OOM and oom["reason"]
    assert len(by_mode["ok"]) == 10 and all(r["status"] == OK for r in by_mode["ok"])


def test_bad_modes_are_one_line(tmp_path: Path, capsys) -> None:
    assert fi.main(["--device", "cpu", "--modes", "ok,melt", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'melt'" in err
