"""Process-wide settings: one call (sentemb.common.process.configure_process) that each command makes first,
idempotent; none made anywhere else but the few that library use needs, each listed here with its reason."""

from __future__ import annotations

import ast
import logging
import warnings

import matplotlib
import pytest

from sentemb.common.log_noise import DropLines, DropPoolerOnlyReport
from sentemb.common.parts import KIND_PACKAGES
from sentemb.common.paths import PROJECT_ROOT
from sentemb.common.process import FIGURE_BACKEND, configure_process
from tests.test_structure import COMMANDS, MODULES, PACKAGE

# commands that make no process-wide setting → why
UNCONFIGURED = {"download": "stdlib only (urllib, tarfile): none of the libraries configure_process sets up"}
# calls that set something for the whole process → the modules that make them, and why there
PROCESS_WIDE_CALLS = {
    "warnings.filterwarnings": {"sentemb.common.log_noise": "the one list of silenced warnings"},
    "warnings.simplefilter": {},
    "matplotlib.use": {"sentemb.common.process": "the commands' figure backend"},
    "silence_known_noise": {"sentemb.common.process": "configure_process installs log_noise's filters"},
    "configure_process": {f"sentemb.{command}": "a command, first thing in its main" for command in COMMANDS},
    "torch.backends.cuda.enable_flash_sdp": {
        "sentemb.encoders.models.cpu_attention": "only where the CPU's flash kernel fails in bf16 (its probe)"
    },
}
# assignments to a library's process-wide flags → the modules that make them, and why there
PROCESS_WIDE_FLAGS = {
    "torch.utils.deterministic": {"sentemb.training.trainer": "beside the deterministic mode its Trainer switches on"}
}
# module-level calls (run on import) → why they cannot wait for configure_process
AT_IMPORT = {
    ("sentemb.common.hydra_plumbing", "register_resolvers()"): "Hydra resolves hydra.run.dir before main runs",
    (
        "sentemb.encoders.models.padding_free",
        "AttentionInterface.register(ATTENTION, packed_attention)",
    ): "every process holding a padding-free backbone imports this module (a DDP rank that only unpickles one too)",
    (
        "sentemb.encoders.models.padding_free",
        "AttentionMaskInterface.register(ATTENTION, sdpa_mask)",
    ): "as the line above",
    ("sentemb.encoders.models.padding_free", "guard_cpu_attention()"): "every SDPA call of the process reads the "
    "switch it may set, and every process holding a backbone imports this module",
    **{
        (package, "import_parts(__name__, __path__)"): "a package's parts register when it is imported "
        "(common/parts.py), so a new module is found without a list to edit"
        for package in set(KIND_PACKAGES.values())  # each kind of part's package
    },
}
NOISE_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "transformers.modeling_utils")


@pytest.mark.parametrize("command", sorted(COMMANDS - set(UNCONFIGURED)))
def test_each_command_configures_its_process_first(command):
    tree = ast.parse((PACKAGE / f"{command}.py").read_text(encoding="utf-8"))
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    first = main.body[1] if ast.get_docstring(main) else main.body[0]
    assert ast.unparse(first) == "configure_process()", f"sentemb/{command}.py:{first.lineno}: main starts otherwise"


def settings() -> tuple:
    """What configure_process sets: the warning filters, the noise loggers' filters, matplotlib's backend."""
    loggers = [list(logging.getLogger(name).filters) for name in NOISE_LOGGERS]
    return list(warnings.filters), loggers, matplotlib.get_backend()


def test_configure_process_twice_sets_what_once_does():
    backend = matplotlib.get_backend()
    try:
        with warnings.catch_warnings():  # the test process's filters as they were, afterwards
            configure_process()
            once = settings()
            configure_process()
            twice = settings()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("default")
                configure_process()  # catch_warnings reset the filters: the call installs them again
                warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", DeprecationWarning, stacklevel=1)
    finally:
        matplotlib.use(backend)
    assert twice == once
    assert once[2].lower() == FIGURE_BACKEND.lower()
    assert [type(f) for f in once[1][0]].count(DropLines) == 1
    assert [type(f) for f in once[1][1]].count(DropPoolerOnlyReport) == 1
    assert caught == [], "a warning sentemb.common.log_noise lists is silenced by the call"


def scoped(tree: ast.Module) -> set[int]:
    """The nodes inside a `with warnings.catch_warnings():` block: their filters end with the block."""
    blocks = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.With) and any("warnings.catch_warnings" in ast.unparse(i) for i in node.items)
    ]
    return {id(inner) for block in blocks for statement in block.body for inner in ast.walk(statement)}


def process_wide_settings(name: str, tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) of each process-wide setting `tree` makes that the tables above do not allow there."""
    found, inside = [], scoped(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in inside:
            continue
        if name not in PROCESS_WIDE_CALLS.get(ast.unparse(node.func), {name: ""}):
            found.append((node.lineno, ast.unparse(node.func)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                flag = next((f for f in PROCESS_WIDE_FLAGS if ast.unparse(target).startswith(f"{f}.")), None)
                if flag and name not in PROCESS_WIDE_FLAGS[flag]:
                    found.append((node.lineno, ast.unparse(target)))
    for statement in tree.body:  # module level: runs on import, before any command could decide
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            if (name, ast.unparse(statement)) not in AT_IMPORT:
                found.append((statement.lineno, f"on import: {ast.unparse(statement)}"))
    return sorted(found)


def test_the_settings_check_finds_one_made_elsewhere():
    source = [
        "import warnings",
        "warnings.filterwarnings('ignore')",
        "def f():",
        "    matplotlib.use('Agg')",
        "    with warnings.catch_warnings():",
        "        warnings.simplefilter('ignore')  # ends with the block: not process-wide",
    ]
    tree = ast.parse("\n".join(source))
    assert process_wide_settings("sentemb.eval.x", tree) == [
        (2, "on import: warnings.filterwarnings('ignore')"),
        (2, "warnings.filterwarnings"),
        (4, "matplotlib.use"),
    ]


def test_process_wide_settings_are_made_only_where_listed():
    found = [
        f"{path.relative_to(PROJECT_ROOT)}:{line}: {what}"
        for name, path in MODULES.items()
        for line, what in process_wide_settings(name, ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, "process-wide settings outside sentemb.common.process:\n" + "\n".join(found)
