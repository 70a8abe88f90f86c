"""`python -m sentemb.negate in=<corpus.txt> out=<negations.jsonl> [source=spacy|rule] [spacy_model=...]`:
SNCSE's soft negatives, one JSON line [sentence, negation] per non-blank corpus line (the released file format,
which training reads with auxiliary.sncse.source=file).

source=spacy (the default) is the released rule on spaCy's parse (`pip install 'sentemb[spacy]'` and
`python -m spacy download en_core_web_sm`); source=rule the parser-free approximation (sentemb.data.negation).
Each sentence is the line stripped, as the released generate_soft_negative_samples.py writes it. Everything is
checked before any work (a missing `in`, an `out` that exists unless overwrite=true, an `out` that is `in`, spaCy
and its pipeline, an `out` inside a folder another live command holds: a training run's); the file is written into
a temporary file beside `out` and renamed into place only once whole (sentemb.common.published_files), so a failed
or interrupted run leaves no partial `out`, and without overwrite=true an `out` made meanwhile by another command is
never replaced. No temporary file is left either: it is an unnamed file (O_TMPFILE) where the file system has one,
so even SIGKILL leaves nothing; elsewhere it is `.<out>.<host>-<pid>-<token>.partial`, removed on any error and on
SIGTERM, and, after a SIGKILL, by the next write of `out` on the same host. A link at `out` is replaced, never
written through.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import hydra
from omegaconf import DictConfig
from tqdm import tqdm

from sentemb.common.command_line import checked_command_line
from sentemb.common.errors import SentembConfigError
from sentemb.common.folder_lock import enclosing_locks
from sentemb.common.paths import CONF_DIR
from sentemb.common.process import configure_process
from sentemb.common.published_files import exit_on_sigterm, published
from sentemb.data.negation import iter_negate_spacy, load_spacy, negate_offline

GENERATORS = ("spacy", "rule")
USAGE = "python -m sentemb.negate in=<corpus.txt> out=<negations.jsonl>"


@checked_command_line  # an unquoted non-ASCII override: named with its fix, before Hydra's lexer
@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="negate")
def main(cfg: DictConfig) -> None:
    configure_process()
    try:
        with exit_on_sigterm():  # SIGTERM: the temporary file goes as for any failure
            count, out = negate(cfg)
    except SentembConfigError as err:
        sys.exit(f"sentemb: {err}")
    print(f"negate: {count} negations (source={describe(cfg)}) written to {out}")


def describe(cfg: DictConfig) -> str:
    return f"spacy, {cfg.spacy_model}" if cfg.source == "spacy" else str(cfg.source)


def negate(cfg: DictConfig) -> tuple[int, Path]:
    """Every setting and both paths checked, spaCy's pipeline loaded, the corpus read through once (its lines
    counted, its encoding checked); then the negations written to a temporary file, renamed to `out`."""
    corpus, out = checked_paths(cfg)
    if cfg.source not in GENERATORS:
        raise SentembConfigError(
            f"source={cfg.source!r} is not a way to negate sentences. Fix: source=spacy (the released rule on "
            "spaCy's parse) or source=rule (the parser-free approximation)"
        )
    batch_size = cfg.batch_size
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise SentembConfigError(f"batch_size={batch_size!r} must be a whole number >= 1. Fix: batch_size=256")
    if cfg.source == "spacy":
        load_spacy(str(cfg.spacy_model), "source")  # missing spaCy or pipeline: refused before the corpus is read
    total = sum(1 for _ in sentences(corpus))  # a line that is not UTF-8 is named now, before anything is written
    if total == 0:
        raise SentembConfigError(f"in={corpus} holds no sentence (only blank lines). Fix: name the training corpus")
    lines = sentences(corpus)
    if cfg.source == "spacy":
        negations = iter_negate_spacy(lines, str(cfg.spacy_model), batch_size, key="source")
    else:
        negations = map(negate_offline, lines)
    with enclosing_locks(out, f"out={out}", "wait for it to finish, or name an out= outside it"):
        write_atomically(out, pairs(sentences(corpus), negations, total), overwrite=bool(cfg.overwrite))
    return total, out


def checked_paths(cfg: DictConfig) -> tuple[Path, Path]:
    """(in, out), refused with the fix: either missing, `in` not a file, `out` a folder, `out` is `in`, or `out`
    existing without overwrite=true."""
    for key in ("in", "out"):
        if cfg.get(key) is None or not str(cfg[key]).strip():
            raise SentembConfigError(f"{key}= is required. Fix: {USAGE}")
    corpus, out = Path(str(cfg["in"])).expanduser(), Path(str(cfg["out"])).expanduser()
    if not corpus.is_file():
        what = "is a folder, not a file" if corpus.is_dir() else "does not exist"
        raise SentembConfigError(f"in={corpus} {what}. Fix: in=<the corpus, one sentence per line>")
    if out.resolve() == corpus.resolve() or (out.exists() and os.path.samefile(out, corpus)):
        raise SentembConfigError(f"out={out} is the corpus itself (in=). Fix: name another file, out=<negations.jsonl>")
    if out.is_dir():
        raise SentembConfigError(f"out={out} is a folder. Fix: name a file in it, out={out / 'negations.jsonl'}")
    if os.path.lexists(out) and not cfg.overwrite:  # a link there too, dangling or not
        raise SentembConfigError(f"out={out} exists. Fix: overwrite=true to replace it, or name another out=")
    return corpus, out


def sentences(corpus: Path) -> Iterator[str]:
    """Each non-blank line of `corpus`, stripped; a line that is not UTF-8 is refused with its number."""
    with corpus.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as err:
                raise SentembConfigError(
                    f"in={corpus}, line {number}: not UTF-8 ({err}). Fix: convert the corpus to UTF-8 "
                    f"(iconv -f <its encoding> -t utf-8)"
                ) from None
            if line:
                yield line


def pairs(lines: Iterator[str], negations: Iterator[str], total: int) -> Iterator[str]:
    """The output's lines, `[sentence, negation]` as JSON, with a progress bar on stderr."""
    with tqdm(total=total, desc="negate", unit=" sentences") as progress:
        for sentence, negation in zip(lines, negations, strict=True):
            progress.update()
            yield json.dumps([sentence, negation], ensure_ascii=False) + "\n"


def write_atomically(out: Path, lines: Iterator[str], overwrite: bool) -> None:
    """`lines` published as `out` (sentemb.common.published_files): renamed over it with overwrite, else linked (a
    link never replaces a file: an `out` made meanwhile is refused). Whatever stops the writing, no partial `out` and
    no temporary file is left (see the module's docstring)."""
    try:
        with published(out, "w", replace=overwrite, encoding="utf-8") as handle:
            handle.writelines(lines)
    except FileExistsError:
        raise SentembConfigError(
            f"out={out} appeared while negating (another command wrote it); it was left as it is. Fix: "
            "overwrite=true to replace it, or name another out="
        ) from None


if __name__ == "__main__":
    main()
