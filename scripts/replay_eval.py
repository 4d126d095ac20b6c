"""Replay a trace through the serving simulator with every policy a user could run, and compare them.

    python scripts/replay_eval.py --trace azure-conv --model mixtral-8x7b --routing zipf:1.2 \
        --policies default,static,vllm-table,autotune,random,tpe,learned,oracle --json out/replay_conv.json

Same arguments as `kernel-gym replay` (kernel_gym/policies/replay.py; docs/deployment.md).
"""

from __future__ import annotations

import sys

from kernel_gym.policies.replay import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
