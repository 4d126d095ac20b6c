"""Fill the measurement store on the GPU machine: `python3 scripts/collect.py --budget-s 480 --out ...`.

Thin entry point for kernel_gym.cli.collect (kernel_gym.measure.collect, --ray on measure.farm; imports only torch,
triton, numpy and the standard library).
Examples:
  python3 scripts/collect.py --dry-run                      # plan size and projected time
  python3 scripts/collect.py --budget-s 480 --db h200.sqlite --out kernel_gym/data/h200_measurements.jsonl.gz
  python3 scripts/collect.py --db h200.sqlite --noise 3 --noise-out noise.json   # noise study
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernel_gym.cli.collect import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
