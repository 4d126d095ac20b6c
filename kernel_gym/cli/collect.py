"""`kernel-gym collect`: measure/collect.py's command, with --ray handed to the farm (measure/farm.py). The farm
builds on collect.py, so the command layer joins the two instead of collect importing the farm back."""

from __future__ import annotations

import sys
from typing import Any


def run_on_farm(args: Any, timing: Any) -> int:
    """collect --ray: the parsed collect arguments run on a Ray cluster (exit 2 with the install line without Ray)."""
    from kernel_gym.measure import farm

    try:
        farm.require_ray()
    except farm.RayMissing as exc:
        print(exc, file=sys.stderr)
        return 2
    return farm.main(args, timing)


def main(argv: list[str] | None = None) -> int:
    from kernel_gym.measure import collect

    return collect.main(argv, farm_main=run_on_farm)


if __name__ == "__main__":
    raise SystemExit(main())
