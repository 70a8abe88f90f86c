"""The package's structure: no import cycles, a top level of commands, layers that import only downward.

LAYERS, lowest first: a module imports only from its own layer or one before it. common/ is what
every part may use; losses/, encoders/ and data/ each need common/ alone; eval/ scores encoders;
training/ trains them (and scores dev with eval/); runs/ runs training jobs and sweeps; the top
level is the commands (and the exported folders' module, `sentemb.st_modules`).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import sentemb
from sentemb.common.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "sentemb"
COMMANDS = {
    "train",
    "evaluate",
    "export",
    "analysis",
    "sweep_report",
    "compare",
    "download",
    "mteb_sts",
    "negate",
    "mine",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path) -> dict[str, int]:
    """Every sentemb module `path` imports anywhere in its body (function-level imports included: a deferred
    import closes a cycle just as well), with the line of its first import."""
    found: dict[str, int] = {}
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
                found.setdefault(name, node.lineno)
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


IMPORTS = {name: imported_modules(path) for name, path in MODULES.items()}
GRAPH = {name: set(imports) - {name} for name, imports in IMPORTS.items()}
LAYERS = ("common", "losses", "encoders", "data", "eval", "training", "runs", "top")


def layer_of(path: Path) -> str:
    """A module's layer: its sub-package's name, or `top` for the package's own modules (commands, st_modules)."""
    return "top" if path.parent == PACKAGE else path.relative_to(PACKAGE).parts[0]


def upward_imports(imports: dict[str, dict[str, int]], layers: dict[str, str], order: tuple[str, ...]) -> list[str]:
    """Each import of a module from a layer after its own, as `<module>:<line> imports <module>` with the layers."""
    rank = {layer: index for index, layer in enumerate(order)}
    return [
        f"{name}:{line} ({layers[name]}) imports {target} ({layers[target]}): {layers[name]} may import only "
        f"{', '.join(order[: rank[layers[name]] + 1])}"
        for name, targets in sorted(imports.items())
        for target, line in sorted(targets.items())
        if rank[layers[target]] > rank[layers[name]]
    ]


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_package_has_no_import_cycle():
    assert len(GRAPH) > 40 and GRAPH["sentemb.train"], "the walk found the package and its imports"
    assert find_cycle(GRAPH) is None, f"import cycle: {' -> '.join(find_cycle(GRAPH))}"


def test_hydra_plumbing_imports_nothing_else_from_sentemb():
    assert GRAPH["sentemb.common.hydra_plumbing"] == set()


def test_the_layer_check_names_an_upward_import():
    layers = {"a": "common", "b": "eval", "c": "runs"}
    imports = {"a": {}, "b": {"a": 3, "c": 7}, "c": {"a": 1, "b": 2}}
    assert upward_imports(imports, layers, ("common", "eval", "runs")) == [
        "b:7 (eval) imports c (runs): eval may import only common, eval"
    ]


def test_every_module_is_in_a_layer():
    layers = {layer_of(path) for path in MODULES.values()}
    assert layers == set(LAYERS), f"a sub-package that LAYERS does not place: {layers - set(LAYERS)}"


def test_every_import_goes_to_its_own_layer_or_one_before_it():
    layers = {name: layer_of(path) for name, path in MODULES.items()}
    upward = upward_imports(IMPORTS, layers, LAYERS)
    assert not upward, "imports against LAYERS:\n" + "\n".join(upward)


def test_the_layout_page_states_the_layers_in_their_order():
    page = (PACKAGE.parent / "docs" / "layout.md").read_text(encoding="utf-8")
    stated = re.search(r"\*\*(common →[^*]+)\*\*", page).group(1).split("→")
    stated = [" ".join(layer.split()) for layer in stated]  # the page wraps lines
    assert [*stated[:-1], "top"] == list(LAYERS) and stated[-1] == "the commands", stated
    tree = re.findall(r"^  (\w+)/$", page, flags=re.MULTILINE)  # the sub-packages in the page's tree
    assert [*tree, "top"] == list(LAYERS), tree


def layout_tree(page: str) -> set[str]:
    """The modules the layout page's tree lists, as paths under sentemb/ (each entry's folder from its indentation)."""
    block = page.split("```\nsentemb/\n", 1)[1].split("```", 1)[0]
    listed, folders = set(), []
    for line in block.splitlines():
        match = re.match(r"^( +)([\w./]+)(?: |$)", line)
        if not match or not match.group(2).replace("/", "").replace(".", "").replace("_", "").isalnum():
            continue
        depth = len(match.group(1)) // 2 - 1
        name = match.group(2)
        folders = folders[:depth]
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        elif name.endswith(".py"):
            listed.add("/".join([*folders, name]))
    return listed


def test_the_layout_page_lists_every_module():
    """docs/layout.md's tree is complete: every module of the package (but the packages' __init__.py) is a row."""
    page = (PACKAGE.parent / "docs" / "layout.md").read_text(encoding="utf-8")
    modules = {str(path.relative_to(PACKAGE)) for path in MODULES.values() if path.name != "__init__.py"}
    listed = layout_tree(page) - {"__init__.py"}
    assert not modules - listed, f"modules missing from docs/layout.md's tree: {sorted(modules - listed)}"
    assert not listed - modules, f"rows of docs/layout.md's tree with no module: {sorted(listed - modules)}"


def test_no_command_imports_another():
    commands = {f"sentemb.{command}" for command in COMMANDS}
    for command in sorted(commands):
        assert not GRAPH[command] & commands, f"{command} imports {GRAPH[command] & commands}"


def test_the_top_level_is_the_commands_and_the_exported_folders_module():
    top = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__"}
    assert top == COMMANDS | {"st_modules", "__main__"}  # __main__: `python -m sentemb` lists the commands
    for command in COMMANDS:
        source = (PACKAGE / f"{command}.py").read_text(encoding="utf-8")
        assert "def main(" in source and 'if __name__ == "__main__":' in source, command
        assert f"python -m sentemb.{command}" in sentemb.__doc__, f"sentemb/__init__.py does not list {command}"


LIGHTNING_FREE = ["sentemb.st_modules", "sentemb.encoders.build", "sentemb.losses", "sentemb.eval.sts"]


IMPORT_EACH = """
import importlib, sys
for module in sys.argv[1:]:
    importlib.import_module(module)
    assert "lightning" not in sys.modules, (module, [m for m in sys.modules if "lightning" in m])
"""


def test_library_parts_import_without_lightning():
    # one fresh interpreter, Lightning looked for after each import: the first module that brings it in is named
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH, *LIGHTNING_FREE], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]


def structure_summary() -> str:
    """Modules per package (the encoders' sub-packages apart), import edges, upward imports and cycles: the figures
    a restructuring quotes before and after (`python tests/test_structure.py`)."""
    packages: dict[str, int] = {}
    for path in MODULES.values():
        package = ".".join(("sentemb", *path.relative_to(PACKAGE).parent.parts))
        packages[package] = packages.get(package, 0) + 1
    layers = {name: layer_of(path) for name, path in MODULES.items()}
    lines = [f"{package:28s} {count}" for package, count in sorted(packages.items())]
    lines.append(f"modules {len(MODULES)}, import edges {sum(len(targets) for targets in GRAPH.values())}")
    lines.append(f"imports against the layer order: {len(upward_imports(IMPORTS, layers, LAYERS))}")
    lines.append(f"import cycles: {0 if find_cycle(GRAPH) is None else 'at least 1'}")
    return "\n".join(lines)


def test_the_structure_summary_counts_every_module():
    assert f"modules {len(MODULES)}," in structure_summary() and "import cycles: 0" in structure_summary()


if __name__ == "__main__":
    print(structure_summary())


# the generic core: it builds and runs whatever parts a config names, and names no method (a comment or docstring may
# cite one as an example)
CORE = ("training/module.py", "encoders/build.py", "encoders/part_configs.py", "encoders/poolings/base.py")
CORE += ("training/checks.py", "training/loss_inputs.py", "losses/inputs.py", "losses/base.py")
METHODS = re.compile(r"momentum|dclr|sncse|soft.?negative|negation|diffcse|sarcse|mntp|esimcse|hicl", re.IGNORECASE)


def named_methods(path: Path) -> list[str]:
    """Each identifier and non-docstring string of `path` that names a method, with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        words = []
        if isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, ast.arg):
            words = [node.arg]
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
            words = [node.name]
        elif isinstance(node, ast.alias):
            words = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            words = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words = [node.value]
        found += [f"{path.relative_to(PACKAGE)}:{node.lineno}: {w!r}" for w in words if METHODS.search(w)]
    return found


def test_the_named_methods_finder_finds_one():
    path = PACKAGE / "training" / "auxiliary" / "sncse.py"
    assert any("SoftNegativeMargin" in line for line in named_methods(path))


def test_the_generic_core_names_no_method():
    found = [line for name in CORE for line in named_methods(PACKAGE / name)]
    assert not found, "the core names a method (a part declares what it needs instead):\n" + "\n".join(found)


def test_no_import_is_kept_only_to_register_a_part():
    kept = [
        f"{path.relative_to(PROJECT_ROOT)}:{number}"
        for path in MODULES.values()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "noqa: F401" in line and "regist" in line.partition("noqa: F401")[2]  # its reason: to register
    ]
    assert not kept, f"a part kind's package registers its parts when looked up (common/parts.py): {kept}"


# ---- contracts on the parts, not in lists


def part_bases() -> list[type]:
    """The base class of every kind of part a config names by registry name (each declares its flags on itself)."""
    from sentemb.encoders.poolings.base import Pooling
    from sentemb.losses.base import Objective
    from sentemb.training.auxiliary import AuxiliaryTerm
    from sentemb.training.negatives import NegativesPart

    return [Objective, Pooling, NegativesPart, AuxiliaryTerm]


def declared_flags() -> set[str]:
    """The plain values the part bases (and their sentemb mixins) declare at class level: what a part says about
    itself (`reads`, `no_negatives`, `label`, `graph_refusal`, ...), read as an attribute of a part of that base."""
    flags = set()
    for base in part_bases():
        for cls in base.__mro__:
            if cls.__module__.startswith("sentemb."):
                flags |= {
                    name
                    for name, value in vars(cls).items()
                    if not name.startswith("_")
                    and not callable(value)
                    and not isinstance(value, property | classmethod)
                }
    return flags


def getattr_of_flags(path: Path, flags: set[str]) -> list[str]:
    """Each getattr/hasattr of `path` that reads one of `flags` by name: a part whose base declares the flag has it."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{shown(path)}:{node.lineno}: {node.args[1].value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in flags
    ]


def shown(path: Path) -> str:
    return str(path.relative_to(PROJECT_ROOT)) if path.is_relative_to(PROJECT_ROOT) else str(path)


def test_the_flags_finder_finds_one(tmp_path):
    source = tmp_path / "reads_a_flag.py"
    source.write_text("def f(loss):\n    return getattr(loss, 'no_negatives', None), getattr(loss, 'tau', 0)\n")
    assert getattr_of_flags(source, {"no_negatives"}) == [f"{source}:2: 'no_negatives'"]


def test_no_getattr_reads_a_declared_flag_of_a_part():
    flags = declared_flags()
    assert {"reads", "no_negatives", "label", "graph_refusal"} <= flags, "the finder sees the bases' declarations"
    found = [line for path in MODULES.values() for line in getattr_of_flags(path, flags)]
    assert not found, "a part's base declares this flag (read it as an attribute):\n" + "\n".join(found)


def name_lists(path: Path, kinds: dict[str, set[str]]) -> list[str]:
    """Each collection of bare names (a list, tuple or set literal, or a comma-joined string) in `path` holding 3 or
    more registered names of one kind, outside `pytest.mark.parametrize`'s arguments (examples a test picks, not a
    list a new part must join)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and "parametrize" in ast.unparse(node.func)
        for argument in node.args[1:]
        for inner in ast.walk(argument)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        values: list[str] = []
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            values = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            values = values if len(values) == len(node.elts) else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and ", " in node.value:
            values = [piece.strip() for piece in node.value.split(",")]
        for kind, registered in kinds.items():
            if len(values) >= 3 and all(value in registered for value in values):
                found.append(f"{shown(path)}:{node.lineno}: {kind}: {', '.join(values)}")
    return found


def test_no_list_of_part_names_outside_the_registry():
    """A list of parts a new part would have to join (the losses that take negatives, the scored ones, the terms) is
    derived from the registry and what each part declares; the registry and the yaml are the only lists."""
    from sentemb.common.parts import KINDS, names

    kinds = {kind: set(names(kind)) for kind in KINDS}
    tests = sorted((PROJECT_ROOT / "tests").glob("*.py"))
    found = [line for path in [*MODULES.values(), *tests] for line in name_lists(path, kinds)]
    assert not found, "a list of part names (derive it from the registry):\n" + "\n".join(found)


def test_the_name_list_finder_finds_one(tmp_path):
    listed = tmp_path / "listed.py"
    listed.write_text(
        "TAKES = ('a', 'b', 'c')\nFIX = 'a, b, c'\nPAIR = ['a', 'b']\n"
        "@pytest.mark.parametrize('name', ['a', 'b', 'c'])\ndef test(name): ...\n"
    )
    assert name_lists(listed, {"loss": {"a", "b", "c"}}) == [f"{listed}:1: loss: a, b, c", f"{listed}:2: loss: a, b, c"]
