"""The `kernel-gym` command: the parser builds, every subcommand answers --help, bad input exits 2 with a message,
and every delegated subcommand resolves to a module with a main(argv)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_gym import cli

ROOT = Path(__file__).resolve().parents[1]
OWN = ("bench", "data", "ui")  # parsed by cli's own subparsers; the rest by their stage's main(argv)
COMMANDS = (*OWN, *cli.DELEGATED)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_parser_builds_with_every_subcommand() -> None:
    parser = cli.build_parser()
    assert parser.prog == "kernel-gym"
    assert set(_subcommands(parser)) == set(COMMANDS)
    args = parser.parse_args(["bench", "--kernels", "fused_moe", "--configs", "7"])
    assert (args.command, args.kernels, args.configs, args.func) == ("bench", "fused_moe", 7, cli._cmd_bench)
    assert parser.parse_args(["data", "--json"]).json is True
    assert parser.parse_args(["ui"]).port == 5000


def test_top_level_help_lists_every_subcommand(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_help_exits_0(command: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ")
    assert f"kernel-gym {command}" in out  # the stage's own parser names itself as the subcommand


@pytest.mark.parametrize("argv", [["no-such-command"], [], ["bench", "--no-such-flag"], ["ui", "--port", "x"]])
def test_bad_commands_and_flags_exit_2(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "usage: kernel-gym" in capsys.readouterr().err


def test_unknown_command_exits_2_from_the_installed_entry_point() -> None:
    proc = subprocess.run([sys.executable, "-m", "kernel_gym.cli", "no-such-command"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "invalid choice: 'no-such-command'" in proc.stderr


@pytest.mark.parametrize("command", sorted(cli.DELEGATED))
def test_delegated_commands_resolve_to_a_main(command: str) -> None:
    module_name, help_text = cli.DELEGATED[command]
    assert module_name.startswith("kernel_gym.") and help_text
    module = importlib.import_module(module_name)
    assert callable(getattr(module, "main", None)), f"{module_name} has no main(argv)"


def test_delegated_bad_input_prints_the_problem_and_exits_2(capsys) -> None:
    assert cli.main(["demo", "--timesteps", "10"]) == 2  # ValueError from the stage, before any training
    err = capsys.readouterr().err
    assert err.startswith("kernel-gym demo: error:") and "--timesteps must be >= 512" in err


def test_a_leading_double_dash_is_dropped_for_delegated_commands(monkeypatch) -> None:
    seen: list[list[str]] = []
    fake = type(sys)("kernel_gym._fake_stage")
    fake.main = lambda argv: seen.append(list(argv)) or 0
    monkeypatch.setitem(sys.modules, "kernel_gym._fake_stage", fake)
    monkeypatch.setitem(cli.DELEGATED, "fake", ("kernel_gym._fake_stage", "test stage"))
    assert cli.main(["fake", "--", "--x", "1"]) == 0
    assert cli.main(["fake", "y"]) == 0
    assert seen == [["--x", "1"], ["y"]]


def test_a_missing_stage_module_exits_3(monkeypatch, capsys) -> None:
    monkeypatch.setitem(cli.DELEGATED, "gone", ("kernel_gym.no_such_stage", "a stage this version lacks"))
    assert cli.main(["gone"]) == 3
    assert "not available in this version" in capsys.readouterr().err


def test_usage_errors_from_own_commands_exit_2(monkeypatch, capsys) -> None:
    def bad(args: argparse.Namespace) -> int:
        raise cli.UsageError("--db x.sqlite does not exist: pass a measurement store")

    monkeypatch.setattr(cli, "_cmd_data", bad)
    assert cli.main(["data"]) == 2
    assert capsys.readouterr().err == "kernel-gym data: error: --db x.sqlite does not exist: pass a measurement store\n"
