"""`python -m kernel_gym.cli ...`, the same as the `kernel-gym` console script."""

import sys

from kernel_gym.cli import main

sys.exit(main())
