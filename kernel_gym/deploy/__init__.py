"""The deployment job: export a policy as dispatch tables and engine config files (export.py, engine_export.py,
serving_export.py), tune it for a new model on the GPU (tune.py, engine_tune.py), plan a deployment (plan.py), adapt
online (adapt.py) and the re-optimisation cycle (cycle.py, cycle_gpu.py)."""

import kernel_gym.train  # noqa: F401 - MLflow's noise off before any mlflow import (train/__init__.py)
