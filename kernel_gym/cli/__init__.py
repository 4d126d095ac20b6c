"""The `kernel-gym` command: one subcommand per stage of the data flow (docs/architecture.md).

Each subcommand is one module here, `kernel_gym/cli/<name>.py`: its `main(argv)` parses the subcommand's arguments
and calls the stage's library function with plain values; no library module parses arguments. The modules are
imported only when their subcommand runs, so `kernel-gym --help` is instant and GPU-only commands never import
gymnasium or mlflow. Bad input exits with code 2 and a message that names the problem and the fix; any other error
exits 1 with one line; `kernel-gym --debug COMMAND ...` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand -> its line in `kernel-gym --help`; kernel_gym.cli.<subcommand> parses its arguments and runs it.
COMMANDS = {
    "bench": "GPU: time each kernel's configs against anchors (SDPA, copy, matmul, torch loop)",
    "data": "summarise the embedded H200 dataset (or --db PATH)",
    "collect": "GPU: fill the measurement store (resumable, time budget)",
    "train": "train a MaskablePPO policy on an environment; logs to MLflow",
    "replay": "replay a trace through the serving simulator with each policy",
    "export": "export a registered policy as a dispatch table or vLLM config files",
    "tune": "GPU: measure the policy's top candidates for a new model, export the table",
    "demo": "the main job on embedded defaults, CPU only: train, export, replay, compare",
    "plan": "recommend a deployment (replicas, TP/EP, engine knobs) for a trace and SLO",
    "cycle": "re-optimisation cycle: read the period's traffic, re-plan the engine's MoE configs, confirm (--gpu), "
             "exit 0/10/11 for CI",
    "ui": "start the MLflow UI on 127.0.0.1 for the kernel_gym store (mlruns/)",
}


def build_parser() -> argparse.ArgumentParser:
    """The top level: `--debug` and the list of subcommands (each subcommand's module builds its own options)."""
    parser = argparse.ArgumentParser(
        prog="kernel-gym",
        description="Learn Triton kernel configs for MoE LLM serving from real compile-and-measure data.",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (before the command)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)  # parsed by kernel_gym.cli.<name>.main(argv)
    return parser


def quiet_known_warnings() -> None:
    """Silence warnings a normal run would print that point at nothing the user can change: MLflow asks for type
    hints on the policy model's predict (left out on purpose: MLflow would infer a wrong schema from them). MLflow
    raises it under its own `simplefilter("once")`, in front of any filter, so the formatter drops it too."""
    import warnings

    warnings.filterwarnings("ignore", message=r".*Add type hints to the `predict` method", category=UserWarning)
    plain = warnings.formatwarning
    if getattr(plain, "kernel_gym", False):  # installed by an earlier call in this process
        return

    def kernel_gym_first(message, category, filename, lineno, line=None):  # type: ignore[no-untyped-def]
        """kernel_gym's own warnings (OverloadWarning, TraceWarning, SpecWarning, ...) as one line naming their
        kind, not Python's file, line number and source line, which point into the package; others as Python
        prints them."""
        if "Add type hints to the `predict` method" in str(message):
            return ""
        if category.__module__.startswith("kernel_gym."):
            return f"warning ({category.__name__}): {message}\n"
        return plain(message, category, filename, lineno, line)

    kernel_gym_first.kernel_gym = True  # type: ignore[attr-defined]
    warnings.formatwarning = kernel_gym_first


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    quiet_known_warnings()
    debug = False
    while argv and argv[0] == "--debug":  # global flag before the command: show tracebacks
        debug, argv = True, argv[1:]
    if argv and argv[0] in COMMANDS:
        command, rest = argv[0], argv[1:]
    else:  # the top-level help, or a usage error naming the commands (both exit); only `-- COMMAND` gets past
        command, rest = build_parser().parse_args(argv).command, []
    rest = rest[1:] if rest[:1] == ["--"] else rest
    try:
        rc = importlib.import_module(f"kernel_gym.cli.{command}").main(rest)
        return rc if isinstance(rc, int) else 0
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        if debug:
            raise
        print(f"kernel-gym {command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # a message (collect's "collect: ..." refusals) in the shared format; codes pass
        if not isinstance(exc.code, str) or debug:
            raise
        text = exc.code.removeprefix(f"{command}: ").removeprefix("error: ")
        print(f"kernel-gym {command}: error: {_one_line(SystemExit(text))}", file=sys.stderr)
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
