"""The one-way import order (docs/architecture.md): kernels < measure < traffic < dispatch < parallel < envs < train <
deploy = evaluate < cli (deploy and evaluate, two jobs of the top floor, share one level).

Every module under kernel_gym/ is parsed with ast; each import of kernel_gym (absolute or relative, at module level or
inside a function) is mapped to its floor and must not be above the importing module's floor. cli/, demo.py and
bench.py are the cli floor; the package root, models.py, modelspec.py and zoo.py are the bottom "spec" floor that
every floor may import, and they themselves import only kernels.workloads and each other.

Argument parsing is the command layer's (issue 28): argparse (or optparse, getopt) is imported, and sys.argv read,
only under kernel_gym/cli/, one module per subcommand; the library functions below take keyword arguments.

No two modules may import each other (in either direction, at any depth of the file: a lazy or TYPE_CHECKING import
counts too): a pair that needs each other shares a piece that belongs one level down (issue 28). The harnesses
(scripts/*.py, benchmarks/<study>/*.py) sit above every floor: each kernel_gym or benchmarks import they make must name
a module that exists, they never import the test tree, and the package never imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "kernel_gym"
FLOORS = ("kernels", "measure", "traffic", "dispatch", "parallel", "envs", "train", "deploy", "evaluate", "cli")
# Floors that share a level with the one before them: an evaluation replays exported tables (evaluate -> deploy) and a
# deployment plan is scored by replays (deploy -> evaluate); no two of their files import each other.
SAME_LEVEL_AS_PREVIOUS = {"evaluate"}
CLI_MODULES = {"cli", "demo", "bench"}
SPEC_MODULES = {"models", "modelspec", "zoo"}
# What the spec floor may import besides itself.
SPEC_MAY_IMPORT = ("kernel_gym.kernels.workloads",)
# (importing file, imported module prefix) -> why the exception is allowed.
ALLOWED = {
    ("kernel_gym/__init__.py", "kernel_gym.envs"):
        "`import kernel_gym` registers the Gymnasium ids (lazily, in _register_envs, only with gymnasium installed)",
}
SPEC = -1  # below kernels: importable from every floor


def module_name(path: str) -> str:
    """'kernel_gym/measure/coverage.py' -> 'kernel_gym.measure.coverage' ('kernel_gym/envs/__init__.py' ->
    'kernel_gym.envs')."""
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def floor_of(module: str) -> int | None:
    """The floor index of a kernel_gym module name (SPEC for the spec floor), None for one outside every floor."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    if len(parts) == 1 or parts[1] in SPEC_MODULES:
        return SPEC
    if parts[1] in CLI_MODULES:
        return level("cli")
    if parts[1] in FLOORS:
        return level(parts[1])
    return None


def level(floor: str) -> int:
    """The level of a floor: its place in FLOORS, less one for each earlier floor that shares the level before it."""
    i = FLOORS.index(floor)
    return i - sum(1 for f in FLOORS[: i + 1] if f in SAME_LEVEL_AS_PREVIOUS)


def floor_name(lvl: int) -> str:
    """The floor(s) at a level, e.g. 'deploy/evaluate'."""
    return "/".join(f for f in FLOORS if level(f) == lvl)


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every kernel_gym import anywhere in the tree. `from X import a, b` yields
    X.a and X.b (a name may be a submodule); relative imports are resolved against `module`."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != PACKAGE:
                continue
            out += [(node.lineno, f"{target}.{a.name}") for a in node.names]
    return sorted(out)


def violations(source: str, path: str) -> list[str]:
    """Every import in `source` (the text of the module at `path`, relative to the repository root) that goes up
    the floors, or lands outside every floor, as 'path:line: message'."""
    module = module_name(path)
    own = floor_of(module)
    if own is None:
        return [f"{path}:1: {module} is on no floor: add its package to FLOORS in tests/test_import_order.py"]
    problems = []
    for line, target in imported_modules(ast.parse(source), module, path.endswith("__init__.py")):
        if any(target == p or target.startswith(p + ".") for (f, p) in ALLOWED if f == path):
            continue
        floor = floor_of(target)
        if floor is None:
            problems.append(f"{path}:{line}: imports {target}, which is on no floor")
        elif own == SPEC:
            if floor != SPEC and not any(target == p or target.startswith(p + ".") for p in SPEC_MAY_IMPORT):
                problems.append(f"{path}:{line}: the spec floor imports {target}; it may import only "
                                f"{', '.join(SPEC_MAY_IMPORT)} and the spec modules")
        elif floor > own:
            problems.append(f"{path}:{line}: {floor_name(own)} imports {target} from the higher floor "
                            f"{floor_name(floor)}")
    return problems


def test_no_module_imports_a_higher_floor():
    files = sorted((ROOT / PACKAGE).rglob("*.py"))
    assert len(files) > 50
    problems = []
    for f in files:
        rel = f.relative_to(ROOT).as_posix()
        problems += violations(f.read_text(), rel)
    assert not problems, "upward imports (docs/architecture.md, floors):\n" + "\n".join(problems)


def test_the_checker_reports_wrong_imports():
    source = (
        "from kernel_gym.kernels.space import Config\n"
        "from kernel_gym.models import load_model\n"
        "from kernel_gym import zoo\n"
        "import kernel_gym.measure.types\n"
        "def f():\n"
        "    from kernel_gym.train.train import train\n"
        "    import kernel_gym.envs.base\n"
        "from ..dispatch import catalogue\n"
        "from . import roofline\n"
        "from kernel_gym import cli\n"
    )
    found = violations(source, "kernel_gym/measure/example.py")
    assert [p.split(":")[1] for p in found] == ["6", "7", "8", "10"], found
    assert "kernel_gym.train.train" in found[0] and "kernel_gym.dispatch.catalogue" in found[2]
    assert violations("from kernel_gym.traffic.simulator import Simulator\n", "kernel_gym/dispatch/x.py") == []
    assert violations("from kernel_gym.dispatch.rules import fastest\n", "kernel_gym/traffic/x.py")
    assert violations("from kernel_gym.measure.types import OK\n", "kernel_gym/models.py")
    assert violations("from kernel_gym.kernels.workloads import MoEWorkload\n", "kernel_gym/zoo.py") == []
    assert violations("import os\n", "kernel_gym/newfloor/x.py")
    assert violations("from kernel_gym.deploy.export import build_table\n", "kernel_gym/train/x.py")
    assert violations("from kernel_gym.deploy.export import build_table\n", "kernel_gym/evaluate/x.py") == []
    assert violations("from kernel_gym.evaluate.replay import replay\n", "kernel_gym/deploy/x.py") == []
    assert violations("from kernel_gym.cli import main\n", "kernel_gym/evaluate/x.py")


PARSING_MODULES = ("argparse", "optparse", "getopt")
# Library modules that read sys.argv themselves -> why.
READS_ARGV = {
    "kernel_gym/measure/power.py": "`python -m kernel_gym.measure.power [SECONDS]`, the GPU machine's clock and power "
                                   "check (docs/measurement.md): one optional number, no parser",
}


def argument_parsing(source: str, path: str) -> list[str]:
    """Every import of an argument parser and every read of sys.argv in a module outside kernel_gym/cli/, as
    'path:line: message' (the command layer parses; library functions take keyword arguments)."""
    if path.startswith(f"{PACKAGE}/cli/"):
        return []
    problems = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        for name in names:
            if name.split(".")[0] in PARSING_MODULES:
                problems.append(f"{path}:{node.lineno}: imports {name}: parse arguments in kernel_gym/cli/<command>.py "
                                "and call this module with keyword arguments")
        if (isinstance(node, ast.Attribute) and node.attr == "argv" and isinstance(node.value, ast.Name)
                and node.value.id == "sys" and path not in READS_ARGV):
            problems.append(f"{path}:{node.lineno}: reads sys.argv: only kernel_gym/cli/ reads the command line")
    return problems


def test_only_the_command_layer_parses_arguments():
    problems = []
    for f in sorted((ROOT / PACKAGE).rglob("*.py")):
        problems += argument_parsing(f.read_text(), f.relative_to(ROOT).as_posix())
    assert not problems, "argument parsing outside the command layer:\n" + "\n".join(problems)
    assert all("sys.argv" in (ROOT / p).read_text() for p in READS_ARGV), "an exception no longer needed"


def test_the_parsing_checker_sees_parsers_and_argv():
    source = ("import argparse\n"
              "import json\n"
              "def main():\n"
              "    from optparse import OptionParser\n"
              "    import sys\n"
              "    return sys.argv[1:]\n")
    found = argument_parsing(source, "kernel_gym/deploy/x.py")
    assert [p.split(":")[1] for p in found] == ["1", "4", "6"], found
    assert argument_parsing(source, "kernel_gym/cli/x.py") == []
    assert argument_parsing("import argparse.x\n", "kernel_gym/kernels/x.py")


def import_graph(files: dict[str, str]) -> dict[str, dict[str, int]]:
    """module -> {imported kernel_gym module: first line}, for the modules in `files` (path -> source). `from X
    import a` counts as X.a where that is a module, else as X (the longest module prefix of the name)."""
    modules = {module_name(p): p for p in files}
    graph: dict[str, dict[str, int]] = {}
    for path, source in files.items():
        module = module_name(path)
        for line, target in imported_modules(ast.parse(source), module, path.endswith("__init__.py")):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != module:
                graph.setdefault(module, {}).setdefault(target, line)
    return graph


def two_way_imports(files: dict[str, str]) -> list[str]:
    """'a (line) <-> b (line)' for each pair of modules that import each other."""
    graph = import_graph(files)
    return [f"{a}:{graph[a][b]} <-> {b}:{graph[b][a]}" for a in sorted(graph) for b in sorted(graph[a])
            if a < b and a in graph.get(b, {})]


def test_no_two_modules_import_each_other():
    files = {f.relative_to(ROOT).as_posix(): f.read_text() for f in sorted((ROOT / PACKAGE).rglob("*.py"))}
    pairs = two_way_imports(files)
    assert not pairs, "two-way imports (move the shared piece one level down):\n" + "\n".join(pairs)


def test_the_two_way_checker_sees_lazy_and_relative_imports():
    files = {
        "kernel_gym/measure/a.py": "def f():\n    from kernel_gym.measure import b\n",
        "kernel_gym/measure/b.py": "from .a import thing\n",
        "kernel_gym/measure/c.py": "from kernel_gym.measure.a import thing\n",
    }
    assert two_way_imports(files) == ["kernel_gym.measure.a:2 <-> kernel_gym.measure.b:1"]


# The harnesses outside the package (scripts/*.py, benchmarks/<study>/*.py) sit above every floor: they may import any
# kernel_gym module and each other's benchmarks/<study>/*.py, never the test tree, and the package never imports them.
HARNESS_GLOBS = ("scripts/*.py", "benchmarks/*/*.py")


def harness_problems(source: str, path: str, modules: set[str]) -> list[str]:
    """Every import in a harness (scripts/x.py, benchmarks/study/x.py) of a kernel_gym or benchmarks module that does
    not exist (a path a move left stale) or of the test tree, as 'path:line: message'. `modules`: every kernel_gym
    module name and every harness's under benchmarks/."""
    problems = []
    for line, target in imported_modules(ast.parse(source), path[:-3].replace("/", "."), False):
        if target not in modules and target.rpartition(".")[0] not in modules:  # a module, or a name in one
            problems.append(f"{path}:{line}: imports {target}, which is no kernel_gym module")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top == "tests":
                problems.append(f"{path}:{node.lineno}: a harness imports the test tree ({name})")
            elif top == "benchmarks" and name not in modules and name.rpartition(".")[0] not in modules:
                problems.append(f"{path}:{node.lineno}: imports {name}, which is no harness under benchmarks/")
    return problems


def test_harnesses_import_existing_modules_and_not_the_tests():
    harnesses = sorted({f for g in HARNESS_GLOBS for f in ROOT.glob(g)})
    assert len(harnesses) > 20
    modules = {module_name(f.relative_to(ROOT).as_posix()) for f in (ROOT / PACKAGE).rglob("*.py")}
    modules |= {module_name(f.relative_to(ROOT).as_posix()) for f in harnesses if f.parts[-3] == "benchmarks"}
    problems = []
    for f in harnesses:
        problems += harness_problems(f.read_text(), f.relative_to(ROOT).as_posix(), modules)
    for f in sorted((ROOT / PACKAGE).rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if not getattr(node, "level", 0) and any(n.split(".")[0] in ("scripts", "tests", "benchmarks")
                                                         for n in names):
                    problems.append(f"{f.relative_to(ROOT)}:{node.lineno}: the package imports a harness or test")
    assert not problems, "harness imports:\n" + "\n".join(problems)


def test_the_harness_checker_sees_stale_paths_and_test_imports():
    modules = {"kernel_gym", "kernel_gym.deploy", "kernel_gym.deploy.export"}
    assert harness_problems("from kernel_gym.deploy.export import build_table\n", "scripts/x.py", modules) == []
    found = harness_problems("from kernel_gym.policies.export import build_table\nfrom tests.fakes import y\n"
                             "from benchmarks.cycle import old_name\n", "benchmarks/cycle/x.py", modules)
    assert [p.split(":")[1] for p in found] == ["1", "2", "3"], found
    assert harness_problems("from benchmarks.cycle import run\n", "benchmarks/cycle/x.py",
                            modules | {"benchmarks.cycle.run"}) == []
