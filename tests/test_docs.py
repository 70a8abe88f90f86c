"""The documentation is true: README.md and docs/*.md link only to what exists, and their commands compose.

Links: every relative link and `#anchor` resolves (the file or folder exists inside the checkout; an anchor is a
heading of the target page, slugged as GitHub slugs it). Commands: every `python -m sentemb.train|evaluate|export`
and `make train ARGS="..."` line of a fenced code block is composed in this process with Hydra's compose API and
the same overrides, as the command would compose it: a `-m` sweep (or an `hparams_search=` one) once per option of
each swept config group, with every value of every swept key; `--cfg job` as the config it prints; `<placeholder>`
values as any string. Hydra reads conf/ afresh for each composition (~0.2 s of CPU), so the overrides that pick
defaults are composed once per distinct set and the key overrides applied to a copy by Hydra's own last step;
each command line is its own test case, all of them together a few seconds.

Overrides in the prose and tables: every inline code span made only of `key=value` / `group=option` words (as a
reader would type them after `python -m sentemb.train`) composes with one of the commands' configs, each of a
span's `a|b` alternatives in turn; a key under a config group (`loss.m=0.3`) composes under at least one option of
that group, as the text around it says which. Spans elided (`key=`, `...`, `*`) or not sentemb's (NOT_OVERRIDES)
are skipped.
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
import shlex
import unicodedata
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import unquote

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, Override
from omegaconf import DictConfig, OmegaConf

from sentemb.common.hydra_plumbing import compose_config
from sentemb.common.paths import CONF_DIR, PROJECT_ROOT

PAGES = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
# the Hydra commands of sentemb → the config each composes (conf/<name>.yaml)
CONFIGS = {"train": "train", "evaluate": "eval", "export": "export", "negate": "negate", "mine": "mine"}
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")
# [text](target) and ![alt](target), with an optional "title"; [label]: target definitions
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'][^)]*[\"'])?\s*\)")
DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+[^>]*(?:id|name)=[\"']([^\"']+)[\"']", re.I)
PLACEHOLDER = re.compile(r"<[^<>]*>")  # `<run>`, `<stage-1-folder>`: a value the reader fills in
# Hydra's own flags: -m runs a sweep; the others print or help, composing the same config
HYDRA_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p"}
HYDRA_FLAGS = {"--resolve", "--help", "-h", "--hydra-help"}


# ---------------------------------------------------------------- markdown


def blank_fences(text: str) -> str:
    """`text` with its fenced code blocks blanked (line numbers kept)."""
    lines, fence = [], None
    for line in text.splitlines():
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened[1]
            lines.append("")
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return "\n".join(lines)


def blank_code(text: str) -> str:
    """`text` with fenced code blocks and inline code spans blanked (line numbers kept): prose only."""
    return re.sub(r"(`+)(.+?)\1", lambda m: re.sub(r"[^\n]", " ", m[0]), blank_fences(text), flags=re.S)


def code_blocks(text: str) -> list[tuple[int, str]]:
    """(1-based line number, line) of every line inside a fenced code block."""
    found, fence = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened[1]
        elif fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            else:
                found.append((number, line))
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its rendered text lowercased, punctuation and symbols dropped (letters,
    digits, marks, `-` and `_` kept), each space a `-`. Inline markup goes first: `code` and [text](url) keep
    their text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")  # HTML tags; code spans keep their text
    kept = (c for c in text.lower() if c in "-_ " or c.isalnum() or unicodedata.category(c).startswith("M"))
    return "".join(kept).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every anchor a page has: its headings' slugs (a repeated slug gets -1, -2, ... as on GitHub), HTML ids."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for line in blank_fences(markdown).splitlines():
        if heading := HEADING.match(line):
            base = slug(heading[2])
            name = base if base not in counts else f"{base}-{counts[base]}"
            counts[base] = counts.get(base, 0) + 1
            found.add(name)
    return found | set(HTML_ANCHOR.findall(markdown))


@functools.cache
def page_anchors(path: Path) -> frozenset[str]:
    return frozenset(anchors(path.read_text(encoding="utf-8")))


def links(markdown: str) -> list[tuple[int, str]]:
    """(line number, target) of every link in the prose (not in code)."""
    prose = blank_code(markdown)
    found = [(m.start(1), m[1]) for m in INLINE_LINK.finditer(prose)]
    found += [(m.start(1), m[1]) for m in DEFINITION.finditer(prose)]
    return sorted((prose.count("\n", 0, at) + 1, target) for at, target in found)


def broken_links(page: Path, root: Path = PROJECT_ROOT) -> list[str]:
    """What is wrong with each relative link of `page`: a missing file, a file outside `root`, an unknown anchor."""
    problems = []
    for line, target in links(page.read_text(encoding="utf-8")):
        where = f"{page.relative_to(root)}:{line}: ({target})"
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:: not followed (no network)
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not linked.is_relative_to(root.resolve()):
            problems.append(f"{where} points outside the repository")
        elif not linked.exists():
            problems.append(f"{where}: {linked.relative_to(root.resolve())} does not exist")
        elif anchor and linked.suffix == ".md" and unquote(anchor) not in page_anchors(linked):
            problems.append(f"{where}: {linked.name} has no heading with the anchor #{anchor}")
        elif anchor and linked.suffix != ".md" and not re.fullmatch(r"L\d+(-L\d+)?", anchor):
            problems.append(f"{where}: an anchor into a file that is not markdown")
    return problems


# ---------------------------------------------------------------- commands


@dataclass(frozen=True)
class DocCommand:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def shell_lines(markdown: str) -> list[tuple[int, str]]:
    """The fenced code blocks' lines with `\\` continuations joined, numbered by their first line."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in code_blocks(markdown):
        start, text = pending if pending else (number, "")
        text += line.rstrip()
        if text.endswith("\\"):
            pending = (start, text[:-1] + " ")
        else:
            pending = None
            joined.append((start, text))
    return joined


def is_command(text: str) -> bool:
    """A line running a sentemb Hydra command: `[VAR=x ...] [$ ]python -m sentemb.<cmd>` or `make train`."""
    words = text.strip().removeprefix("$ ").split()
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]  # environment assignments before the command
    if len(words) >= 3 and Path(words[0]).name.startswith("python") and words[1] == "-m":
        return words[2] in {f"sentemb.{command}" for command in CONFIGS}
    return words[:2] == ["make", "train"]


def doc_commands(pages: list[Path] = PAGES, root: Path = PROJECT_ROOT) -> list[DocCommand]:
    return [
        DocCommand(str(page.relative_to(root)), number, text.strip())
        for page in pages
        for number, text in shell_lines(page.read_text(encoding="utf-8"))
        if is_command(text)
    ]


def parse_command(text: str) -> tuple[str, bool, list[str]]:
    """(config name, whether -m was given, the Hydra overrides) of a command line; ValueError if it is not one."""
    words = shlex.split(text.strip().removeprefix("$ "), comments=True)
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    if words[:2] == ["make", "train"]:
        args = [w.split("=", 1)[1] for w in words[2:] if w.startswith("ARGS=")]
        others = [w for w in words[2:] if not w.startswith("ARGS=")]
        if others:
            raise ValueError(f'`make train` takes its overrides in ARGS="...", not {others}')
        name, arguments = "train", shlex.split(" ".join(args))
    else:
        name, arguments = CONFIGS[words[2].removeprefix("sentemb.")], words[3:]
    multirun, overrides, rest = False, [], iter(arguments)
    for word in rest:
        if word in ("-m", "--multirun"):
            multirun = True
        elif word in HYDRA_FLAGS_WITH_VALUE:
            next(rest, None)  # --cfg job: prints the config the same overrides compose
        elif word in HYDRA_FLAGS:
            continue
        elif word.startswith("-"):
            raise ValueError(f"{word}: not a flag Hydra's command line takes")
        else:
            overrides.append(PLACEHOLDER.sub("placeholder", word))
    return name, multirun, overrides


def sweep_values(override: Override) -> list[str]:
    """A swept key's or group's values as override strings (an interval: its two ends)."""
    value = override.value()
    if isinstance(value, IntervalSweep):
        return [str(value.start), str(value.end)]
    return list(override.sweep_string_iterator())


@functools.cache
def compose(name: str, overrides: tuple[str, ...]) -> DictConfig:
    """conf/<name>.yaml composed by Hydra's compose API with the overrides that pick its defaults."""
    return compose_config(CONF_DIR, name, list(overrides))


@functools.cache
def config_groups(name: str) -> frozenset[str]:
    """The config groups a `name=option` override picks (conf/'s directories and Hydra's own, `hydra/launcher`)."""
    return frozenset(compose(name, ()).hydra.runtime.choices) | {p.name for p in CONF_DIR.iterdir() if p.is_dir()}


def picks_defaults(override: Override, name: str) -> bool:
    """Whether Hydra applies `override` while it composes the defaults (a group, or the read-only hydra node)
    rather than to the composed config afterwards (any other key)."""
    return override.key_or_group in config_groups(name) or re.split(r"[./]", override.key_or_group)[0] == "hydra"


def with_keys(cfg: DictConfig, overrides: list[Override]) -> DictConfig:
    """A copy of `cfg` with key overrides applied by the step of Hydra's composition that applies them after the
    defaults are merged (the same errors: `Could not override 'loss.tauu'`); far cheaper than composing again."""
    job = copy.deepcopy(cfg)
    ConfigLoaderImpl._apply_overrides_to_config(overrides, job)
    return job


def compose_command(text: str) -> list[DictConfig]:
    """Each configuration the command line composes: one, or for a sweep one per option of each swept config
    group, with every value of every swept key applied in turn (a key must exist under each group option).
    Raises what Hydra raises, or ValueError for a sweep without -m."""
    name, multirun, overrides = parse_command(text)
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    fixed = [o for o in parsed if not o.is_sweep_override()]
    defaults = tuple(o.input_line for o in fixed if picks_defaults(o, name))
    keys = [o for o in fixed if not picks_defaults(o, name)]
    base = with_keys(compose(name, defaults), keys)
    swept = [o for o in parsed if o.is_sweep_override()]
    multirun = multirun or "MULTIRUN" in str(OmegaConf.select(base, "hydra.mode", default=""))  # hparams_search=
    if swept and not multirun:
        raise ValueError(f"{swept[0].input_line} sweeps without -m: Hydra refuses it outside a multirun")
    if not multirun:
        return [base]
    on_command_line = {o.key_or_group for o in parsed}
    params = OmegaConf.select(base, "hydra.sweeper.params", default=None) or {}
    swept += [parser.parse_override(f"{key}={spec}") for key, spec in params.items() if str(key) not in on_command_line]
    groups = [[f"{o.get_key_element()}={v}" for v in sweep_values(o)] for o in swept if picks_defaults(o, name)]
    values = [
        parser.parse_override(f"{o.get_key_element()}={v}")
        for o in swept
        if not picks_defaults(o, name)
        for v in sweep_values(o)
    ]
    return [with_keys(compose(name, (*defaults, *picked)), keys + values) for picked in itertools.product(*groups)]


# ---------------------------------------------------------------- overrides in the prose and tables

SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")  # an inline code span (fences are blanked before)
# a Hydra override as typed: key=value or group=option, the value not empty (`loss=` names the group, not a value);
# environment variables (`WANDB_MODE=offline`) are upper case, pip pins have `==`
OVERRIDE_WORD = re.compile(r"^[+~]?[a-z_][\w.\-/]*=(?!=)\S+$")
ELIDED = re.compile(r"\.\.\.")  # `data.max_length=...`: no value shown
# spans of that shape that are not sentemb overrides: Python arguments in sentemb's code and the released code's
# own options (each must still be in the docs, so this list cannot outlive what it excuses)
NOT_OVERRIDES = {
    "trust_remote_code=False": "an argument of transformers' from_pretrained",
    "weights_only=True": "an argument of torch.load",
    "serves=ENCODERS": "a class attribute in sentemb's code",
    "export=NATIVE": "a class attribute in sentemb's code",
    "dup_type=bpe": "ESimCSE's released script's option",
    "loss=a,b": "the syntax of a swept group, a and b standing for any options",
}
# the config group a key of the composed config lives under, when it is not the key's first part
GROUP_OF = {"hydra.launcher": "launcher", "hydra.sweeper": "hparams_search"}


@dataclass(frozen=True)
class DocOverrides:
    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: `{self.text}`"


def doc_overrides(pages: list[Path] = PAGES, root: Path = PROJECT_ROOT) -> list[DocOverrides]:
    """Every inline code span of the prose and tables that is a run of overrides (not elided)."""
    found = []
    for page in pages:
        for number, line in enumerate(blank_fences(page.read_text(encoding="utf-8")).splitlines(), start=1):
            for span in SPAN.finditer(line):
                words = span[1].split()
                if words and all(OVERRIDE_WORD.match(w) for w in words) and not ELIDED.search(span[1]):
                    found.append(DocOverrides(str(page.relative_to(root)), number, span[1].strip()))
    return found


def options(word: str) -> list[str]:
    """`experiment=simcse/<backbone>`, `experiment=esimcse/*` or `loss=<name>`: the first option of the group the
    pattern matches (each preset is composed by its own tests; here: the family exists and composes), or the word as
    written when none matches (to fail); any other word as it is."""
    group, _, option = word.partition("=")
    if not (CONF_DIR / group).is_dir() or not re.search(r"<[^<>]*>|\*", option):
        return [word]
    pattern = PLACEHOLDER.sub("*", option)
    matches = [f"{group}={name}" for name in group_options(group) if fnmatch(name, pattern)]
    return matches[:1] or [word]


def group_options(group: str) -> list[str]:
    """A config group's options: its YAML files' paths under it, folders included (`sncse/tiny`)."""
    folder = CONF_DIR / group
    return sorted(p.relative_to(folder).with_suffix("").as_posix() for p in folder.rglob("*.yaml"))


def alternatives(text: str) -> list[str]:
    """`pooling.mlp=train|always|none` → one override line per alternative (`\\|`: a `|` escaped in a table; a `|`
    inside a `<placeholder>` is part of it), and a group's family (`experiment=focal/<backbone>`) as one option."""
    per_word = []
    for word in text.replace("\\|", "|").split():
        key, _, value = word.partition("=")
        choices = re.split(r"\|(?![^<>]*>)", value)
        per_word.append([option for choice in choices for option in options(f"{key}={choice}")])
    return [" ".join(words) for words in itertools.product(*per_word)]


def group_contexts(text: str) -> list[str]:
    """Each option of the config group under which `text`'s keys live (`loss.m=0.3` → `loss=mmhe`, ...)."""
    groups = set()
    for word in text.split():
        key = word.split("=", 1)[0].lstrip("+~")
        group = next((g for prefix, g in GROUP_OF.items() if key.startswith(prefix + ".")), key.split(".")[0])
        if "." in key and (CONF_DIR / group).is_dir():
            groups.add(group)
    return [f"{g}={option}" for g in sorted(groups) for option in group_options(g)]


def override_errors(text: str) -> list[str]:
    """Why the overrides `text` compose with none of the commands' configs (each alternative); [] when they do."""
    errors = []
    for line in alternatives(text):
        tried = [f"python -m sentemb.{command} -m {line}" for command in CONFIGS]
        tried += [f"python -m sentemb.train -m {context} {line}" for context in group_contexts(line)]
        failures = []
        for command in tried:
            try:
                compose_command(command)
                break
            except Exception as err:  # noqa: BLE001 - Hydra's errors and ours alike: the next context
                failures.append(f"{command}: {type(err).__name__}: {str(err).splitlines()[0]}")
        else:
            errors.append(f"`{line}` composes nowhere:\n  " + "\n  ".join(failures[: len(CONFIGS)]))
    return errors


# ---------------------------------------------------------------- the tests

COMMANDS = doc_commands()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    problems = broken_links(page)
    assert not problems, "\n".join(problems)


def test_the_docs_have_commands_to_check():
    readme = [c for c in COMMANDS if c.page == "README.md"]
    assert len(readme) >= 3 and any("make train" in c.text for c in readme), readme
    pages = {c.page for c in COMMANDS}
    assert len(pages) >= 5, f"commands found only in {pages}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.page}:{c.line}")
def test_every_command_line_composes(command):
    try:
        configs = compose_command(command.text)
    except Exception as err:  # noqa: BLE001 - Hydra's errors and ours alike fail the line, named
        pytest.fail(f"{command}\ndoes not compose: {type(err).__name__}: {err}", pytrace=False)
    assert configs


OVERRIDES = doc_overrides()


def test_the_docs_have_overrides_to_check():
    assert len(OVERRIDES) >= 100 and any(o.text == "scheduler.warmup_ratio=0.1" for o in OVERRIDES)
    shown = {o.text for o in OVERRIDES} | {c.text for c in COMMANDS}
    unused = [text for text in NOT_OVERRIDES if not any(text in line for line in shown)]
    assert not unused, f"NOT_OVERRIDES excuses what no page shows any more: {unused}"


@pytest.mark.parametrize("overrides", OVERRIDES, ids=lambda o: f"{o.page}:{o.line}:{o.text}")
def test_every_override_in_the_prose_composes(overrides):
    if overrides.text in NOT_OVERRIDES:
        pytest.skip(NOT_OVERRIDES[overrides.text])
    errors = override_errors(overrides.text)
    assert not errors, f"{overrides}\n" + "\n".join(errors)


# the checks themselves: each must fail on what it exists to catch


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Corpora larger than memory: `data.streaming=true`", "corpora-larger-than-memory-datastreamingtrue"),
        ("Measured (this machine: 2 CPU cores, torch 2.13.0 CPU)", "measured-this-machine-2-cpu-cores-torch-2130-cpu"),
        ("Big batches, several GPUs, fp16, resuming", "big-batches-several-gpus-fp16-resuming"),
        ("Paper text or public code: `loss.convention`", "paper-text-or-public-code-lossconvention"),
        ("`loss=sum`: a weighted sum of objectives", "losssum-a-weighted-sum-of-objectives"),
        ("align_mhe and align_mhs: alignment + uniformity", "align_mhe-and-align_mhs-alignment--uniformity"),
        ("InfoNCE → ArcCon (τ, u)", "infonce--arccon-τ-u"),
        ("See [Sweeps](sweeps.md)", "see-sweeps"),
    ],
)
def test_slugs_are_githubs(heading, anchor):
    assert slug(heading) == anchor


def test_a_repeated_heading_gets_a_numbered_anchor():
    page = "# Notes\n## Notes\n### `Notes`\n```\n# Notes\n```\n"
    assert anchors(page) == {"notes", "notes-1", "notes-2"}


def test_broken_links_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n", encoding="utf-8")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n[ok](other.md#other-page) [self](#page) [web](https://example.org/x) `[code](nowhere.md)`\n"
        "[gone](missing.md)\n[bad anchor](other.md#no-such-heading)\n[up](../../outside.md)\n"
        "```\n[in code](nowhere.md)\n```\n[def]: #nope\n",
        encoding="utf-8",
    )
    problems = broken_links(page, root=tmp_path)
    assert [p.split(":")[1] for p in problems] == ["3", "4", "5", "9"], problems
    assert "missing.md does not exist" in problems[0] and "#no-such-heading" in problems[1]
    assert "outside the repository" in problems[2] and "#nope" in problems[3]


def test_commands_are_found_in_code_blocks_only(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "python -m sentemb.train loss=infonce\n"
        "```bash\n"
        "python -m sentemb.train -m loss.tau=0.03,0.05 \\\n"
        "    seed=1,2   # a comment\n"
        "SENTEMB_DATA=/d .venv/bin/python -m sentemb.evaluate tasks=sts\n"
        'make train ARGS="loss.tau=0.1"\n'
        "python -m sentemb.sweep_report multirun/train/x\n"
        "make test\n"
        "```\n",
        encoding="utf-8",
    )
    found = [(c.line, c.text) for c in doc_commands([page], root=tmp_path)]
    assert [line for line, _ in found] == [3, 5, 6], found
    assert parse_command(found[0][1]) == ("train", True, ["loss.tau=0.03,0.05", "seed=1,2"])
    assert parse_command(found[1][1]) == ("eval", False, ["tasks=sts"])
    assert parse_command(found[2][1]) == ("train", False, ["loss.tau=0.1"])
    assert parse_command("python -m sentemb.train --cfg job loss=mpt") == ("train", False, ["loss=mpt"])


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("python -m sentemb.train loss.tauu=0.1", "loss.tauu"),  # a key the config lacks
        ("python -m sentemb.train loss=nosuchloss", "nosuchloss"),  # an option conf/loss/ lacks
        ("python -m sentemb.train -m loss=infonce,nosuchloss", "nosuchloss"),  # the second option of a sweep
        ("python -m sentemb.train -m loss=mmhe,infonce loss.m=0.2,0.3", "loss.m"),  # a key one swept option lacks
        ("python -m sentemb.train -m hydra.sweeper.n_trial=4 loss.tau=0.1,0.2", "n_trial"),  # a hydra key typo
        ("python -m sentemb.train loss.tau=0.03,0.05", "without -m"),  # a sweep outside a multirun
        ("python -m sentemb.train hparams_search=paradigm_grid", "loss.m"),  # InfoNCE has no m to sweep
        ('make train ARGS="loss.tau=0.1', "quotation"),  # unbalanced quotes
        ("python -m sentemb.train --fast", "--fast"),  # not a Hydra flag
    ],
)
def test_a_line_that_does_not_compose_fails(line, error):
    with pytest.raises(Exception, match=re.escape(error)):
        compose_command(line)


def test_a_sweep_composes_each_option_of_a_swept_group():
    configs = compose_command("python -m sentemb.train -m loss=mmhe,mbarlow loss.m=0.2,0.4")
    assert [c.hydra.runtime.choices.loss for c in configs] == ["mmhe", "mbarlow"]
    assert [c.loss.m for c in configs] == [0.4, 0.4], "every value applied in turn: the last one stays"


def test_overrides_are_found_in_inline_code_and_tables(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Warm up with `scheduler.warmup_ratio=0.1`; `loss=` names the group, `WANDB_MODE=offline` is the shell's.\n"
        "| `pooling.mlp=train\\|none` | `data.max_length=...` | `experiment=*_tiny` | `pip install x==1` |\n"
        "```\n`loss.tauu=0.1`\n```\n`trainer=ddp trainer.devices=4` and `torch==2.13.0`\n",
        encoding="utf-8",
    )
    found = [(o.line, o.text) for o in doc_overrides([page], root=tmp_path)]
    assert found == [
        (1, "scheduler.warmup_ratio=0.1"),
        (2, "pooling.mlp=train\\|none"),
        (2, "experiment=*_tiny"),
        (6, "trainer=ddp trainer.devices=4"),
    ]
    assert alternatives("pooling.mlp=train\\|none seed=1") == ["pooling.mlp=train seed=1", "pooling.mlp=none seed=1"]
    assert alternatives("experiment=labelled/cosent_minilm_<size>") == ["experiment=labelled/cosent_minilm_tiny"]
    assert alternatives("experiment=<bert|roberta>_x") == ["experiment=<bert|roberta>_x"]  # one word, no match
    assert alternatives("experiment=nosuch_<x>") == ["experiment=nosuch_<x>"]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("scheduler.warmup_ratioo=0.1", "warmup_ratioo"),  # a key no config has
        ("loss.tauu=0.1", "loss.tauu"),  # a key under no option of its group
        ("trainer=gpu|nosuchtrainer", "nosuchtrainer"),  # an alternative the others hide
        ("pooling=nosuchpooling", "nosuchpooling"),  # an option the group lacks
        ("launcher=slurm hydra.launcher.partitionn=gpu", "partitionn"),  # a Hydra key typo beside its group
    ],
)
def test_an_override_that_does_not_compose_fails(text, error):
    errors = override_errors(text)
    assert errors and error in "\n".join(errors), errors


def test_a_key_of_one_group_option_composes_under_it():
    assert override_errors("loss.m=0.3") == []  # InfoNCE (the default) has no m; mmhe has
    assert override_errors("scheduler.warmup_ratio=0.1") == []


def test_the_documented_warmup_ratio_sets_the_warmup_steps():
    from sentemb.training.module import check_warmup_ratio, with_warmup_steps

    ratio = OmegaConf.to_container(compose_command("python -m sentemb.train scheduler.warmup_ratio=0.1")[0].scheduler)
    check_warmup_ratio(ratio)
    assert with_warmup_steps(ratio, 360)["num_warmup_steps"] == 36  # docs/labelled.md: the first 10% of the steps
    default = OmegaConf.to_container(compose_command("python -m sentemb.train")[0].scheduler)
    check_warmup_ratio(default)
    assert default["warmup_ratio"] is None and with_warmup_steps(default, 360)["num_warmup_steps"] == 0
    assert "warmup_ratio" not in with_warmup_steps(default, 360)  # never passed to the schedule
