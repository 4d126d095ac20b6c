"""Training, tracking, export and evaluation of config policies.

MLflow's noise on our own pyfunc models is turned off here: the "add type hints to predict" warning (our predict takes
a DataFrame by design) and per-artifact download progress bars (dozens per export or replay).
"""

import os
import warnings

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
warnings.filterwarnings("ignore", message=r".*Add type hints to the `predict` method.*")
