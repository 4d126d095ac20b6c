"""The evaluation job: replay a trace through the serving simulator with each policy (replay.py), its reports and
target checks (replay_report.py) and the Serving-v0 evaluation (serving_eval.py)."""

import kernel_gym.train  # noqa: F401 - MLflow's noise off before any mlflow import (train/__init__.py)
