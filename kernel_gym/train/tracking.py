"""MLflow plumbing: the default store, code/data versions, SB3's logger into MLflow, policy export, and the UI server.

Default store: `mlruns/` in the working directory, a sqlite database `mlruns/mlflow.db` with artifacts in
`mlruns/artifacts` (MLflow refuses a plain file store). MLFLOW_TRACKING_URI overrides it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from stable_baselines3.common.logger import KVWriter

warnings.filterwarnings("ignore", message=".*noload.*")  # sqlalchemy SADeprecationWarning from mlflow's sqlite store
try:
    from sqlalchemy.exc import SADeprecationWarning

    warnings.filterwarnings("ignore", category=SADeprecationWarning)
except ImportError:  # pragma: no cover - sqlalchemy comes with mlflow
    pass

import mlflow  # noqa: E402

PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def default_store(root: str | Path | None = None) -> tuple[str, str]:
    """(tracking URI, artifact root URI) of the default store under `root` (default: the working directory)."""
    base = Path(root or os.getcwd()).resolve() / "mlruns"
    return f"sqlite:///{base / 'mlflow.db'}", (base / "artifacts").as_uri()


def setup_tracking(tracking_uri: str | None = None) -> str:
    """Point MLflow at `tracking_uri`, else MLFLOW_TRACKING_URI, else the default store (created if missing). A sqlite
    store is created atomically and checked before use (ensure_sqlite_store)."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        uri, _ = default_store()
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    check_tracking_uri(uri)
    if uri.partition("://")[0] in ("http", "https"):
        check_server(uri)
    if uri.startswith("sqlite:///") and uri not in ("sqlite:///:memory:",):
        ensure_sqlite_store(Path(uri.removeprefix("sqlite:///")))
        check_schema_version(Path(uri.removeprefix("sqlite:///")))
    mlflow.set_tracking_uri(uri)
    return uri


def sqlite_store_problem(db: Path) -> str | None:
    """Why a sqlite file is not a usable MLflow store (None when it is): not sqlite, no schema version, or the
    `_alembic_tmp_*` tables a migration killed half-way leaves behind."""
    import sqlite3

    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            version = list(con.execute("SELECT version_num FROM alembic_version")) if "alembic_version" in tables \
                else []
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        return f"not a sqlite database ({exc})"
    tmp = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if tmp:
        return f"an interrupted schema migration left {tmp[0]}"
    if not version or "runs" not in tables or "experiments" not in tables:
        return "not an MLflow store (no schema version or runs table)"
    return None


def check_schema_version(db: Path) -> None:
    """A store written by another MLflow version, named with the fix that fits: MLflow itself says "out-of-date, run
    mlflow db upgrade" for a store of a newer MLflow too, where the upgrade cannot work (this MLflow does not know
    its schema)."""
    import sqlite3

    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config, _get_latest_schema_revision

    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    try:
        found = [r[0] for r in con.execute("SELECT version_num FROM alembic_version")]
    finally:
        con.close()
    head = _get_latest_schema_revision()
    if found == [head]:
        return
    known = {r.revision for r in ScriptDirectory.from_config(_get_alembic_config(f"sqlite:///{db}")).walk_revisions()}
    if found and found[0] in known:
        raise ValueError(f"MLflow store {db} was written by an older MLflow (schema {found[0]}; mlflow "
                         f"{mlflow.__version__} reads {head}): back it up (cp {db} {db}.bak), then run `mlflow db "
                         f"upgrade sqlite:///{db}`, or pass another --tracking-uri")
    raise ValueError(f"MLflow store {db} was written by a newer MLflow (schema {found[0] if found else 'none'} is "
                     f"unknown to mlflow {mlflow.__version__}; `mlflow db upgrade` cannot migrate it): open it with "
                     "the MLflow that wrote it, or pass another --tracking-uri")


def _store_is_empty(db: Path) -> bool:
    """No runs and no registered models: nothing of the user's is in it (a store whose creation was killed)."""
    import sqlite3

    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            return all(next(con.execute(f"SELECT COUNT(*) FROM {t}"))[0] == 0  # noqa: S608 - fixed names
                       for t in ("runs", "registered_models") if t in tables)
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return db.stat().st_size == 0


MLFLOW_TABLES = ("alembic_version", "experiments", "runs", "metrics", "params", "tags", "registered_models")


def _foreign_tables(db: Path) -> list[str] | None:
    """The tables of a file that is not MLflow's (a measurement store, a file that is not SQLite: [] then), None for
    an empty file or one holding MLflow's tables (a store whose creation was killed). Such a file is never moved
    aside and replaced: it is the user's data (and a WAL store's -wal would stay behind, next to the new file)."""
    import sqlite3

    if db.stat().st_size == 0:
        return None
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            tables = sorted(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'"))
        finally:
            con.close()
    except sqlite3.DatabaseError:
        return []
    if not tables or any(t in MLFLOW_TABLES or t.startswith("_alembic_tmp_") for t in tables):
        return None
    return tables


def _create_store(path: Path) -> None:
    """Run MLflow's schema creation on `path` (the slow part: ~10 s of migrations)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(f"sqlite:///{path}", (path.parent / "artifacts").resolve().as_uri())
    store.engine.dispose()


def ensure_sqlite_store(db: Path) -> None:
    """Make `db` a usable MLflow store, safely: a new store is created in a temp file and renamed into place (a kill
    -9 during MLflow's first migrations leaves no half store, only a temp file the next run removes); concurrent
    first runs wait on a lock; a store broken by an older interrupted creation and holding nothing is moved aside
    and recreated; one holding runs is refused with the repair in one line."""
    import fcntl

    if db.is_file() and sqlite_store_problem(db) is None:
        return  # usable as it is: no lock file, so a store in a read-only folder can still be read (export, replay)
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        lock = open(db.parent / ".kernel-gym-store.lock", "a+")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise ValueError(f"cannot create the MLflow store {db} ({exc.strerror}: {exc.filename}): make {db.parent} "
                         "writable, or pass a --tracking-uri (MLFLOW_TRACKING_URI) in a writable folder") from None
    with lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released on close, or when the process dies
        if db.exists():
            problem = sqlite_store_problem(db)
            if problem is None:
                return
            foreign = _foreign_tables(db)
            if foreign is not None:
                raise ValueError(f"{db} is not an MLflow store ({problem}; tables: {foreign or 'none'}); it was left "
                                 "as it is: pass another --tracking-uri (MLFLOW_TRACKING_URI), e.g. sqlite:///"
                                 f"{db.parent / 'mlruns' / 'mlflow.db'}")
            if not _store_is_empty(db):
                raise ValueError(f"MLflow store {db} is damaged ({problem}) and holds runs: back it up, then repair "
                                 f"it with `mlflow db upgrade sqlite:///{db}`, or pass another --tracking-uri")
            aside = db.with_name(f"{db.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
            os.replace(db, aside)
            print(f"note: MLflow store {db} was left half-created ({problem}); moved aside to {aside.name} and "
                  "recreated (it held no runs)", file=sys.stderr, flush=True)
        for stale in db.parent.glob(f".{db.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
        try:
            _create_store(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, db)
        finally:
            tmp.unlink(missing_ok=True)


TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")  # file: check_tracking_uri


def check_tracking_uri(uri: str) -> None:
    """A one-line error for a tracking URI MLflow cannot use: unknown scheme, a sqlite file in a missing folder, or a
    file store (file:PATH, or a bare path) where the installed MLflow refuses one (file_store_refused)."""
    if uri.partition(":")[0].lower() == "file" or ":" not in uri or uri.startswith(("/", ".")):  # a folder
        why = file_store_refused()
        if why:
            raise ValueError(f"tracking URI {uri!r}: a file store, which MLflow {mlflow.__version__} refuses ({why}); "
                             "use sqlite:///PATH/mlflow.db (`mlflow migrate-filestore` moves an existing folder "
                             "over), or set MLFLOW_ALLOW_FILE_STORE=true to keep the file store")
        return
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme.split("+")[0] not in TRACKING_SCHEMES:
        raise ValueError(f"tracking URI {uri!r}: use sqlite:///PATH/mlflow.db, http(s)://HOST:PORT or another MLflow "
                         f"store ({', '.join(TRACKING_SCHEMES)})")
    if scheme == "sqlite":
        path = Path(rest[1:] if rest.startswith("/") else rest)
        if rest not in ("/:memory:", ":memory:") and not path.parent.is_dir():
            raise ValueError(f"tracking URI {uri!r}: folder {path.parent} does not exist; create it or pass another "
                             "--tracking-uri")


def file_store_refused() -> str:
    """Why the installed MLflow refuses a file tracking store ('' where it accepts one): since 3.x it raises when one
    is opened unless MLFLOW_ALLOW_FILE_STORE is set, which failed a command only when it logged, after its work."""
    from mlflow.store.tracking.file_store import FileStore

    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a deprecation notice where it still accepts one
        try:
            FileStore(tmp)
        except mlflow.exceptions.MlflowException as exc:
            return "maintenance mode" if "maintenance" in str(exc) else str(exc)[:80]
    return ""


def check_server(uri: str, timeout_s: float = 5.0) -> None:
    """An http(s) tracking server must answer within seconds. MLflow's client retries a refused connection 7 times
    with growing waits and waits 120 s for each request to a host that never answers: a wrong URI hung the command
    for minutes. An HTTP answer below 500 (a 401 behind authentication, a 404 behind a proxy) counts: MLflow takes it
    from there; a 5xx (a gateway with nothing behind it) is one MLflow would retry for minutes."""
    import urllib.error

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s):
            pass
    except urllib.error.HTTPError as exc:
        if exc.code < 500:
            return
        reason = f"HTTP {exc.code} {exc.reason}: a proxy or gateway without the server behind it"  # retried too
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
    else:
        return
    raise ValueError(f"tracking URI {uri}: no MLflow server answers within {timeout_s:g} s ({reason}): start it "
                     "(mlflow server, kernel-gym ui), fix the URI, or unset MLFLOW_TRACKING_URI to use mlruns/ here")


def get_or_create_experiment(name: str, tracking_uri: str) -> str:
    """Experiment id; on the default sqlite store new experiments keep their artifacts in mlruns/artifacts."""
    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    artifact_location = None
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri.removeprefix("sqlite:///"))
        artifact_location = (db.parent / "artifacts").resolve().as_uri()
    return mlflow.create_experiment(name, artifact_location=artifact_location)


def git_commit(path: str | Path = PACKAGE_ROOT) -> str:
    """HEAD of the repository holding the code, with "-dirty" when there are uncommitted changes; "unknown" outside
    a git checkout."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=path, capture_output=True, text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def references_hash(refs: Sequence[Any]) -> str:
    """Hash of the measurements a run trained and evaluated on (workload, config, time): the data version."""
    h = hashlib.sha256()
    for r in sorted(refs, key=lambda r: r.key):
        for c in sorted(r.times, key=str):
            h.update(f"{r.key}|{c}|{r.times[c]:.9g}\n".encode())
    return h.hexdigest()[:16]


class MLflowOutputFormat(KVWriter):
    """SB3 logger output that sends every numeric value to MLflow as a metric at the current timestep, and keeps a
    history (key -> [(step, value)]) for plots."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.client = mlflow.tracking.MlflowClient()
        self.history: dict[str, list[tuple[int, float]]] = {}

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        metrics = []
        now = int(time.time() * 1000)
        for key, value in key_values.items():
            excluded = key_excluded.get(key)
            if excluded is not None and "mlflow" in excluded:
                continue
            if isinstance(value, (bool, str)) or not isinstance(value, (int, float, np.integer, np.floating)):
                continue
            v = float(value)
            if not np.isfinite(v):
                continue
            self.history.setdefault(key, []).append((int(step), v))
            metrics.append(mlflow.entities.Metric(key, v, now, int(step)))
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        pass


def export_policy_arrays(model: Any) -> tuple[dict[str, np.ndarray], str]:
    """The actor of a (Maskable)PPO MlpPolicy as numpy arrays for pyfunc_model.actor_logits, and its activation."""
    import torch.nn as nn

    policy = model.policy
    layers = [m for m in policy.mlp_extractor.policy_net if isinstance(m, nn.Linear)]
    acts = {type(m).__name__ for m in policy.mlp_extractor.policy_net if not isinstance(m, nn.Linear)}
    names = {"Tanh": "tanh", "ReLU": "relu"}
    if len(acts) > 1 or (acts and next(iter(acts)) not in names):
        raise ValueError(f"cannot export activation(s) {acts}: use Tanh or ReLU (policy_kwargs activation_fn)")
    params: dict[str, np.ndarray] = {}
    for i, lin in enumerate(layers):
        params[f"W{i}"] = lin.weight.detach().cpu().numpy().astype(np.float32)
        params[f"b{i}"] = lin.bias.detach().cpu().numpy().astype(np.float32)
    params["W_out"] = policy.action_net.weight.detach().cpu().numpy().astype(np.float32)
    params["b_out"] = policy.action_net.bias.detach().cpu().numpy().astype(np.float32)
    return params, names[next(iter(acts))] if acts else "tanh"


def log_policy_model(
    model: Any,
    kernel: str,
    env_id: str,
    catalogue: Any,
    known: Sequence[tuple[str, np.ndarray, np.ndarray]],
    registered_model_name: str | None,
    extra: dict[str, Any] | None = None,
) -> str:
    """Log the policy as a self-contained pyfunc model (pyfunc_model.py) in the active run, optionally registered;
    returns the model URI ("models:/name/version" when registered, else the logged model's URI).

    known: (workload key, observation, mask) of every workload the run saw (the pyfunc's stored validity masks)."""
    from kernel_gym.dispatch import observation as obs_mod

    params, activation = export_policy_arrays(model)
    meta = {
        "kernel": kernel,
        "env_id": env_id,
        "activation": activation,
        "feature_names": obs_mod.feature_names(kernel),
        "configs": [dict(c) for c in catalogue.configs],
        "known_masks": {k: m.astype(bool).tolist() for k, _, m in known},
        "known_obs": {k: o.astype(float).tolist() for k, o, _ in known},
        **(extra or {}),
    }
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        np.savez(t / "policy.npz", **params)
        (t / "policy.json").write_text(json.dumps(meta))
        shutil.copy(PACKAGE_ROOT / "dispatch" / "observation.py", t / "kernel_gym_observation.py")
        shutil.copy(PACKAGE_ROOT / "kernels" / "workloads.py", t / "kernel_gym_workloads.py")
        shutil.copy(PACKAGE_ROOT / "kernels" / "profiles.py", t / "kernel_gym_profiles.py")
        info = mlflow.pyfunc.log_model(
            name="policy",
            python_model=str(PACKAGE_ROOT / "train" / "pyfunc_model.py"),
            artifacts={"policy_npz": str(t / "policy.npz"), "policy_json": str(t / "policy.json")},
            code_paths=[str(t / "kernel_gym_observation.py"), str(t / "kernel_gym_workloads.py"),
                        str(t / "kernel_gym_profiles.py")],
            # no input_example / signature: rows carry either a workload_key or feature columns
            pip_requirements=["mlflow", "numpy", "pandas"],
            registered_model_name=registered_model_name,
        )
    if registered_model_name:
        version = getattr(info, "registered_model_version", None)
        if version is not None:
            return f"models:/{registered_model_name}/{version}"
    return info.model_uri


def model_specs(model: Any) -> list[Any]:
    """The ModelSpec(s) a policy is trained for: a spec, a built-in name or JSON path, or a list of those."""
    from kernel_gym.models import ModelSpec, load_model

    items = model if isinstance(model, (list, tuple)) else [model]
    return [m if isinstance(m, ModelSpec) else load_model(str(m)) for m in items]


def registered_policy_name(env_id: str, specs: Sequence[Any]) -> str:
    """kernel-gym-<env>-<model> for a policy trained on one model; kernel-gym-<env>-conditioned for a model-conditioned
    one (not the bare kernel-gym-<env>: stores from before this naming hold single-model policies under it)."""
    base = f"kernel-gym-{env_id.split('/')[-1].lower()}"
    return f"{base}-conditioned" if len(specs) != 1 else f"{base}-{specs[0].name}"


TAG_VALUE_LIMIT = 8000  # characters MLflow keeps of a tag value (it truncates longer ones with a warning)


def policy_identity(env_id: str, specs: Sequence[Any], dataset_hash: str) -> dict[str, str]:
    """The tags every registered policy carries (on its run and its model version): which model(s), env, data, code."""
    from dataclasses import asdict

    spec_json = json.dumps([asdict(s) for s in specs], sort_keys=True)
    if len(spec_json) > TAG_VALUE_LIMIT:  # MLflow would cut it mid-JSON (a zoo policy's specs run to ~22k characters)
        spec_json = (f"{len(specs)} model specs, {len(spec_json)} characters of JSON: too long for an MLflow tag; the "
                     "registered model's provenance (model_specs) holds them")
    return {
        "policy.model": ",".join(s.name for s in specs),
        "policy.model_spec": spec_json,
        "policy.model_conditioned": "true" if len(specs) > 1 else "false",
        "env_id": env_id,
        "data.dataset_hash": dataset_hash or "n/a",
        "git_commit": git_commit(),
    }


def tag_model_version(model_uri: str, tags: dict[str, str]) -> None:
    """Set tags on the registered version behind models:/NAME/VERSION (no-op for other URIs, such as MLflow 3's
    models:/m-<id> of a model logged without registering it: --no-register-model)."""
    if not model_uri.startswith("models:/"):
        return
    name, _, version = model_uri[len("models:/"):].rpartition("/")
    if not name or not version.isdigit():
        return
    client = mlflow.tracking.MlflowClient()
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, v)


# ---- the UI --------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui(port: int = 5000, tracking_uri: str | None = None, host: str = "127.0.0.1") -> subprocess.Popen:
    """Start `mlflow server` (one worker, no job runner: answers in ~5 s) for the store; stop it with stop_ui.

    The server is bound to 127.0.0.1 by default: it has no authentication."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_store()[0]
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", host, "--port", str(port), "--backend-store-uri", uri,
           "--workers", "1"]
    if uri.startswith("sqlite:///"):
        artifacts = Path(uri.removeprefix("sqlite:///")).parent / "artifacts"
        cmd += ["--default-artifact-root", artifacts.resolve().as_uri()]
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    log = tempfile.NamedTemporaryFile("w+", prefix="kernel-gym-ui-", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: stop_ui reaches the uvicorn child too
    proc.log_path = log.name  # type: ignore[attr-defined]  # the server's output, for error messages
    log.close()
    return proc


def stop_ui(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a start_ui server and its uvicorn child: SIGTERM to its process group, SIGKILL to the group after
    grace_s. Killing only the `mlflow server` process (it forwards SIGTERM, but a loaded machine may take longer than
    the grace) would leave the child serving the port."""
    import signal

    def signal_group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the whole group is gone already
            pass

    signal_group(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    signal_group(signal.SIGKILL)  # the child may outlive the leader's exit; nothing of the group survives this
    proc.wait(timeout=grace_s)


def wait_for_ui(
    port: int, proc: subprocess.Popen | None = None, timeout_s: float = 60.0, host: str = "127.0.0.1"
) -> str:
    """Poll until the server answers its REST API; returns its base URL. Raises with the server's output on failure."""
    url = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            log = getattr(proc, "log_path", None)
            out = Path(log).read_text() if log else ""
            raise RuntimeError(f"mlflow server exited with {proc.returncode}:\n{out[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/2.0/mlflow/experiments/search?max_results=1", timeout=2) as r:
                if r.status == 200:
                    return url
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"mlflow server on {url} did not answer within {timeout_s} s")
