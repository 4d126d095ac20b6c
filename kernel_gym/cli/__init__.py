"""The `kernel-gym` command: one subcommand per stage of the data flow (docs/architecture.md).

Each subcommand imports its stage lazily, so `kernel-gym --help` is instant and GPU-only commands never import
gymnasium or mlflow. Bad input exits with code 2 and a message that names the problem and the fix; any other error
exits 1 with one line; `kernel-gym --debug COMMAND ...` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path


class UsageError(Exception):
    """Bad input from the user: printed without a traceback, exit code 2."""


def _cmd_bench(args: argparse.Namespace) -> int:
    from kernel_gym import bench

    return bench.main(args)


def _cmd_data(args: argparse.Namespace) -> int:
    if args.drop_row:
        if not args.db or not str(args.db).endswith((".sqlite", ".db")):
            raise UsageError("--drop-row ID needs --db STORE.sqlite (the store the refused row is in)")
        from kernel_gym.measure.store import MeasurementStore

        MeasurementStore(args.db, read_only=True).close()  # a kernel_gym store, not another database
        with MeasurementStore(args.db) as store:
            n = store.drop_rows(args.drop_row)
        print(f"{args.db}: {n} of {len(args.drop_row)} rows dropped")
        return 0
    if args.merge or args.into:
        if not (args.merge and args.into):
            raise UsageError("--merge STORE... needs --into NEW.db (and --into needs --merge)")
        from kernel_gym.measure.storetools import merge_stores

        report = merge_stores(args.merge, args.into)
        print(json.dumps(report, indent=2) if args.json else
              "\n".join([f"{src}: {c['rows']} rows, {c['inserted']} new, {c['duplicates']} already there "
                          f"({c['replicas']} kept as replicas)" for src, c in report["sources"].items()]
                         + [f"{report['into']}: {report['rows']} rows, integrity {report['integrity']}"]))
        return 0
    from kernel_gym.measure import summary

    progress = lambda msg: print(f"[data] {msg}", file=sys.stderr, flush=True)  # noqa: E731 - minutes on 2 cores
    info = summary.dataset_summary(args.db, coverage=not args.counts, progress=progress)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(summary.format_summary(info))
    return 0


def _cmd_ui(args: argparse.Namespace) -> int:
    import signal
    import socket

    from kernel_gym.train import tracking

    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a TCP port is 1-65535; pass e.g. --port 5000")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:  # a server already there would answer wait_for_ui, and its URL would be printed as ours
            s.bind(("127.0.0.1", args.port))
        except OSError as exc:
            raise UsageError(f"--port {args.port} is in use on 127.0.0.1 ({exc.strerror}): pass another --port, or "
                             "stop the process listening there") from None
    uri = tracking.setup_tracking()
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
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except Exception:  # noqa: BLE001 - a server that ignores SIGTERM is killed
            proc.kill()
            proc.wait(timeout=10)


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # MLflow 3's UI: which view an experiment opens on
RUNS_KIND = "custom_model_development"  # the runs view; without the tag MLflow 3.17 opens its empty GenAI overview


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


# Subcommands whose arguments the stage parses itself: (module with main(argv) -> int, help text).
DELEGATED = {
    "collect": ("kernel_gym.cli.collect", "GPU: fill the measurement store (resumable, time budget)"),
    "train": ("kernel_gym.train.train", "train a MaskablePPO policy on an environment; logs to MLflow"),
    "replay": ("kernel_gym.evaluate.replay", "replay a trace through the serving simulator with each policy"),
    "export": ("kernel_gym.deploy.export", "export a registered policy as a dispatch table or vLLM config files"),
    "tune": ("kernel_gym.deploy.tune", "GPU: measure the policy's top candidates for a new model, export the table"),
    "demo": ("kernel_gym.demo", "the main job on embedded defaults, CPU only: train, export, replay, compare"),
    "plan": ("kernel_gym.deploy.plan", "recommend a deployment (replicas, TP/EP, engine knobs) for a trace and SLO"),
    "cycle": ("kernel_gym.deploy.cycle", "re-optimisation cycle: read the period's traffic, re-plan the engine's "
              "MoE configs, confirm (--gpu), exit 0/10/11 for CI"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernel-gym",
        description="Learn Triton kernel configs for MoE LLM serving from real compile-and-measure data.",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (before the command)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("bench", help="GPU: time each kernel's configs against anchors (SDPA, copy, matmul, torch loop)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/h200_kernels.json"), help="JSON results file")
    p.add_argument("--md", type=Path, default=None,
                   help="readable markdown summary (default: beside --out; docs/benchmarks.md keeps its analysis)")
    p.add_argument("--kernels", default="prefill_attention,decode_attention,fused_moe", help="comma-separated families")
    p.add_argument("--configs", type=int, default=120, help="configs timed per case (sampled from the valid space)")
    p.add_argument("--recorded", type=int, default=12,
                   help="also time the packaged dataset's N fastest configs for each case's workload (0: none)")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting new cases after this many seconds")
    p.set_defaults(func=_cmd_bench)


    p = sub.add_parser("data", help="summarise the embedded H200 dataset (or --db PATH)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--db", default=None, help="a measurement store (sqlite) instead of the packaged dataset")
    p.add_argument("--counts", action="store_true",
                   help="rows, statuses and shapes only: skip the config-space coverage (the slow part, ~1.5 min)")
    p.add_argument("--merge", nargs="+", default=None, metavar="STORE",
                   help="merge these stores (.sqlite/.db or .jsonl.gz snapshots) into --into, deduplicated by key")
    p.add_argument("--into", default=None, metavar="DB", help="the store --merge writes (created when missing)")
    p.add_argument("--drop-row", type=int, action="append", default=[], metavar="ID",
                   help="with --db: delete the row with this id (one a reader refused as implausible); repeatable")
    p.set_defaults(func=_cmd_data)

    for name, (_, text) in DELEGATED.items():
        sub.add_parser(name, help=text, add_help=False)  # parsed by the stage's own main(argv)

    p = sub.add_parser("ui", help="start the MLflow UI on 127.0.0.1 for the kernel_gym store (mlruns/)")
    p.add_argument("--port", type=int, default=5000, help="port on 127.0.0.1 (default 5000)")
    p.set_defaults(func=_cmd_ui)
    return parser


def quiet_known_warnings() -> None:
    """Silence warnings a normal run would print that point at nothing the user can change: MLflow asks for type
    hints on the policy model's predict (left out on purpose: MLflow would infer a wrong schema from them)."""
    import warnings

    warnings.filterwarnings("ignore", message=r".*Add type hints to the `predict` method", category=UserWarning)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    quiet_known_warnings()
    debug = False
    while argv and argv[0] == "--debug":  # global flag before the command: show tracebacks
        debug, argv = True, argv[1:]
    if argv and argv[0] in DELEGATED:
        command, rest = argv[0], argv[1:]
        rest = rest[1:] if rest[:1] == ["--"] else rest
        func = lambda: importlib.import_module(DELEGATED[command][0]).main(rest)  # noqa: E731
    else:
        args = build_parser().parse_args(argv)
        command, func = args.command, lambda: args.func(args)  # noqa: E731
    try:
        rc = func()
        return rc if isinstance(rc, int) else 0
    except (UsageError, ValueError, FileNotFoundError, RuntimeError) as exc:
        if debug:
            raise
        print(f"kernel-gym {command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except ImportError as exc:
        missing = getattr(exc, "name", None) or ""
        if missing.startswith("kernel_gym") or "from 'kernel_gym" in str(exc):
            print(f"kernel-gym {command}: not available in this version ({exc})", file=sys.stderr)
            return 3
        if debug:
            raise
        print(f"kernel-gym {command}: error: {_one_line(exc)} (kernel-gym --debug {command} ... shows where)",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"kernel-gym {command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - anything else: one line, the traceback only with --debug
        if debug:
            raise
        print(f"kernel-gym {command}: error: {type(exc).__name__}: {_one_line(exc)} (kernel-gym --debug {command} "
              "... shows the traceback)", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line (a multi-line message keeps its first and last lines)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


if __name__ == "__main__":
    sys.exit(main())
