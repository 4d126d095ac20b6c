"""Replay a trace through the serving simulator with every policy a user could run, and compare them.

    python scripts/replay_eval.py --trace azure-conv --model mixtral-8x7b --routing zipf:1.2 \
        --policies default,static,vllm-table,autotune,random,tpe,learned,oracle --json out/replay_conv.json

Same arguments as `kernel-gym replay` (kernel_gym/cli/replay.py; docs/deployment.md).
`python scripts/replay_eval.py --summary OUT.md REPORT.json ...` writes the target check table of several reports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kernel_gym.cli.replay import main
from kernel_gym.evaluate.replay_report import summary_markdown

if __name__ == "__main__":
    if sys.argv[1:2] == ["--summary"]:
        if len(sys.argv) < 4:
            sys.exit("usage: replay_eval.py --summary OUT.md REPORT.json [REPORT.json ...]")
        out = Path(sys.argv[2])
        reports = [(Path(p).stem, json.loads(Path(p).read_text())) for p in sys.argv[3:]]
        out.write_text(summary_markdown(reports))
        print(out.read_text())
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
