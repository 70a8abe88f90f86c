"""The package's structure: no import cycles, a top level of commands, layers that import only downward."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import sentemb
from sentemb.common.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "sentemb"
COMMANDS = {"train", "evaluate", "export", "analysis", "sweep_report", "download", "mteb_sts"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path) -> set[str]:
    """Every sentemb module `path` imports anywhere in its body (function-level imports included: a deferred
    import closes a cycle just as well)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: a relative import (sentemb imports absolutely)"
            base = node.module or ""
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:  # `import sentemb.a.b` names the module a.b; fall back to packages
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (a list of modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


GRAPH = {name: imported_modules(path) - {name} for name, path in MODULES.items()}


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_package_has_no_import_cycle():
    assert len(GRAPH) > 40 and GRAPH["sentemb.train"], "the walk found the package and its imports"
    assert find_cycle(GRAPH) is None, f"import cycle: {' -> '.join(find_cycle(GRAPH))}"


def test_hydra_plumbing_imports_nothing_else_from_sentemb():
    assert GRAPH["sentemb.common.hydra_plumbing"] == set()


def test_the_common_layer_and_the_encoders_import_no_training_code():
    low = [name for name in GRAPH if name.startswith(("sentemb.common", "sentemb.encoders", "sentemb.losses"))]
    for name in low:
        bad = {t for t in GRAPH[name] if t.startswith(("sentemb.training", "sentemb.runs", "sentemb.data"))}
        assert not bad, f"{name} imports {bad}"


def test_the_top_level_is_the_commands_and_the_exported_folders_module():
    top = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert top == COMMANDS | {"st_modules", "__main__"}  # __main__: `python -m sentemb` lists the commands
    for command in COMMANDS:
        source = (PACKAGE / f"{command}.py").read_text(encoding="utf-8")
        assert "def main(" in source and 'if __name__ == "__main__":' in source, command
        assert f"python -m sentemb.{command}" in sentemb.__doc__, f"sentemb/__init__.py does not list {command}"


LIGHTNING_FREE = ["sentemb.st_modules", "sentemb.encoders.build", "sentemb.losses", "sentemb.eval.sts"]


@pytest.mark.parametrize("module", LIGHTNING_FREE)
def test_library_parts_import_without_lightning(module):
    code = f"import sys, {module}; assert 'lightning' not in sys.modules, [m for m in sys.modules if 'lightning' in m]"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
