"""The training job: MaskablePPO on the kernel envs, MLflow tracking and the logged policy model, policies read back
as data (bundle.py, safe_policy.py) and their candidate rankings (candidates.py), the zoo's model-conditioned policy,
and the measurement plans that cover what the policies choose (measurement_plans.py).

The top floor is split by job (docs/architecture.md): train is below deploy and evaluate, which share one level (an
evaluation replays exported tables; a deployment plan is scored by replays) and may import train.

MLflow's noise on our own pyfunc models is turned off here, for all three jobs (deploy/ and evaluate/ import this
package first): the "add type hints to predict" warning (our predict takes a DataFrame by design) and per-artifact
download progress bars (dozens per export or replay).
"""

import os
import warnings

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
warnings.filterwarnings("ignore", message=r".*Add type hints to the `predict` method.*")
