"""`kernel-gym ui`: the MLflow UI on 127.0.0.1 for the kernel_gym store, opening each experiment on its runs."""

from __future__ import annotations

import argparse
from typing import Sequence

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # MLflow 3's UI: which view an experiment opens on
RUNS_KIND = "custom_model_development"  # the runs view; without the tag MLflow 3.17 opens its empty GenAI overview


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernel-gym ui")
    p.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 (default 5000)")
    p.add_argument("--tracking-uri", default="",
                   help="the MLflow store to browse (default: MLFLOW_TRACKING_URI, else mlruns/ here)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import signal
    import socket

    from kernel_gym.train import tracking

    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port {args.port}: a TCP port is 1-65535; pass e.g. --port 5000")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:  # a server already there would answer wait_for_ui, and its URL would be printed as ours
            s.bind(("127.0.0.1", args.port))
        except OSError as exc:
            raise ValueError(f"--port {args.port} is in use on 127.0.0.1 ({exc.strerror}): pass another --port, or "
                             "stop the process listening there") from None
    uri = tracking.setup_tracking(args.tracking_uri or None)
    pages = runs_pages(uri)
    proc = tracking.start_ui(port=args.port, tracking_uri=uri)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)  # SIGTERM stops the MLflow server child too (finally below)
    try:
        url = tracking.wait_for_ui(args.port, proc=proc)
        print(f"MLflow UI for {uri} at {url} (Ctrl-C stops it)", flush=True)
        for name, exp_id, n in pages:
            print(f"  {name}: {n} runs at {url}/#/experiments/{exp_id}/runs", flush=True)
        print(f"  registered policies: {url}/#/models", flush=True)
        return proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
        tracking.stop_ui(proc)


def runs_pages(tracking_uri: str) -> list[tuple[str, str, int]]:
    """(name, id, runs) of every experiment with runs, tagged as model development (training, replay and evaluation
    runs are), so the UI opens each on its runs view instead of the GenAI overview (traces, token usage)."""
    import mlflow

    client = mlflow.tracking.MlflowClient(tracking_uri)
    out = []
    for exp in client.search_experiments():
        if exp.tags.get(EXPERIMENT_KIND_TAG) is None:
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, RUNS_KIND)
        n = len(client.search_runs([exp.experiment_id], max_results=1000))
        if n:
            out.append((exp.name, exp.experiment_id, n))
    return out
