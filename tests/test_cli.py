"""The `kernel-gym` command: the parser builds, every subcommand answers --help, bad input exits 2 with a message,
and every subcommand resolves to its module kernel_gym/cli/<name>.py with a main(argv)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_gym import cli

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = tuple(cli.COMMANDS)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_parser_builds_with_every_subcommand() -> None:
    parser = cli.build_parser()
    assert parser.prog == "kernel-gym"
    assert set(_subcommands(parser)) == set(COMMANDS)
    assert parser.parse_args(["bench"]).command == "bench"
    from kernel_gym.cli import bench, data, ui

    args = bench.build_parser().parse_args(["--kernels", "fused_moe", "--configs", "7"])
    assert (args.kernels, args.configs) == ("fused_moe", 7)
    assert data.build_parser().parse_args(["--json"]).json is True
    assert ui.build_parser().parse_args([]).port == 5000


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
    assert f"kernel-gym {command}" in out  # the subcommand's parser names itself


@pytest.mark.parametrize("argv", [["no-such-command"], [], ["bench", "--no-such-flag"], ["ui", "--port", "x"],
                                  ["replay", "--json"]])
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


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_resolves_to_its_cli_module(command: str) -> None:
    assert cli.COMMANDS[command]
    module = importlib.import_module(f"kernel_gym.cli.{command}")
    assert callable(getattr(module, "main", None)), f"kernel_gym.cli.{command} has no main(argv)"


def test_bad_input_from_the_stage_prints_the_problem_and_exits_2(capsys) -> None:
    assert cli.main(["demo", "--timesteps", "10"]) == 2  # ValueError from the stage, before any training
    err = capsys.readouterr().err
    assert err.startswith("kernel-gym demo: error:") and "--timesteps must be >= 512" in err


def test_a_leading_double_dash_is_dropped(monkeypatch) -> None:
    seen: list[list[str]] = []
    fake = type(sys)("kernel_gym.cli.fake")
    fake.main = lambda argv: seen.append(list(argv)) or 0
    monkeypatch.setitem(sys.modules, "kernel_gym.cli.fake", fake)
    monkeypatch.setitem(cli.COMMANDS, "fake", "test stage")
    assert cli.main(["fake", "--", "--x", "1"]) == 0
    assert cli.main(["fake", "y"]) == 0
    assert seen == [["--x", "1"], ["y"]]


def test_a_missing_command_module_exits_3(monkeypatch, capsys) -> None:
    monkeypatch.setitem(cli.COMMANDS, "gone", "a command this version lacks")
    assert cli.main(["gone"]) == 3
    assert "not available in this version" in capsys.readouterr().err


def test_usage_errors_exit_2_with_one_line(capsys) -> None:
    assert cli.main(["data", "--drop-row", "3"]) == 2
    assert capsys.readouterr().err == ("kernel-gym data: error: --drop-row ID needs --db STORE.sqlite (the store the "
                                       "refused row is in)\n")
