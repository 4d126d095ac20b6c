"""Apply a learned policy to a deployment: export it as a dispatch table or vLLM fused-MoE config files.

    python scripts/apply_policy.py --model-uri models:/kernel-gym-moe-v0-mixtral-8x7b/1 --format dispatch --out deploy/
    python scripts/apply_policy.py --format vllm --skew 0.6 --out vllm_configs/   # latest registered policies

Same arguments as `kernel-gym export` (kernel_gym/cli/export.py; docs/deployment.md).
"""

from __future__ import annotations

import sys

from kernel_gym.cli.export import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
