"""Train a MaskablePPO agent on a kernel env and log it to MLflow (same as `kernel-gym train`).

    python scripts/train_agent.py --env-id KernelGym/MoE-v0 --backend recorded --total-timesteps 30000 --seed 0

Every TrainArgs field is a flag (see --help); --resume continues an interrupted run from its checkpoint.
"""

from __future__ import annotations

import sys

from kernel_gym.cli.train import main

if __name__ == "__main__":
    try:
        main()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
