"""SNCSE's soft negatives: each training sentence's negation (Wang et al. 2022, Sense-GVT/SNCSE).

Three sources, one entry point (`negate_sentences`, which the `negation` view maker calls):
- ``spacy``: the released rule (Sense-GVT/SNCSE, generate_soft_negative_samples.py) on spaCy's parse
  (`negate_spacy`, the rule itself `negate_parsed`); spaCy is an optional extra (``pip install 'sentemb[spacy]'``)
  and its English pipeline a separate download (``python -m spacy download en_core_web_sm``);
- ``rule``: a parser-free approximation of that rule (`negate_offline`), which needs nothing installed;
- ``file``: the released file format, JSON lines ``[sentence, negation]`` (`read_negations`), as written by
  ``python -m sentemb.negate``.

`lookup_quirk=True` reproduces how train_SNCSE.py looks negations up (see `quirk_lookup`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import string
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import not_text, parse_json

SOURCES = ("rule", "spacy", "file")
DEFAULT_SPACY_MODEL = "en_core_web_sm"
SPACY_BATCH_SIZE = 256
# the ROOT forms the released rule negates by appending " not" (its `special_words`); note: no "be", "been", "'s"
SPECIAL_WORDS = frozenset(
    {"am", "is", "was", "are", "were", "can", "could", "will", "would", "shall", "should", "may", "must", "might"}
)
# train_SNCSE.py's PUNCTUATION: string.punctuation's characters (ASCII only: "…" or "”" do not count)
PUNCTUATION = frozenset(string.punctuation)
REGENERATE = "python -m sentemb.negate in=<the training corpus> out={path} overwrite=true"


# ---------------------------------------------------------------- the released rule


@dataclass(frozen=True)
class ParsedToken:
    """One token of a parse, as the released rule reads it from spaCy: `str(token)`, `dep_`, `tag_`, `lemma_`."""

    text: str
    dep: str
    tag: str
    lemma: str


def negate_parsed(tokens: Sequence[ParsedToken]) -> str:
    """The negation of a parsed sentence by the released rule (generate_soft_negative_samples.py,
    ``convert_to_negation``):

    1. if a token is exactly ``not`` (case-sensitive: ``Not`` and ``n't`` are not), its first occurrence is deleted
       and the remaining tokens are joined by single spaces; done;
    2. else the dependency labels are scanned left to right for the first ``aux``/``auxpass`` (case A) or ``ROOT``
       (case B), whichever comes first;
    3. case A: `` not`` is appended to that auxiliary's text;
    4. case B (the first ROOT): if its lower-cased text is one of SPECIAL_WORDS, `` not`` is appended; else by its
       fine-grained tag VBP → ``do not <lemma>``, VBZ → ``does not <lemma>``, VBD → ``did not <lemma>`` (the lemma
       replaces the token's text: its case is the lemma's); any other tag: ``Not`` (capital N) is prepended as a
       token of its own, the sentence's first token keeping its case;
    5. neither label found (a pipeline without a parser labels nothing; an empty parse): ``Not`` prepended;
    6. the tokens' texts joined by single spaces (so "don't" → "do n't", final punctuation spaced off).

    Where the code is more precise than the spec's summary (§2), the code is followed: ``n't`` is never deleted, so
    "I don't like it." gives "I do not n't like it ." (``do`` is its first aux); ``'s``/``'m`` as a copular ROOT are
    not special words, so "It's fine." (``'s``: VBZ, lemma ``be``) gives "It does not be fine ."; spaCy's
    infinitival ``to`` is labelled ``aux``, so "To win, they trained." gives "To not win , they trained .".
    """
    texts = [token.text for token in tokens]
    if "not" in texts:
        del texts[texts.index("not")]
        return " ".join(texts)
    for index, token in enumerate(tokens):
        if token.dep in ("aux", "auxpass"):
            texts[index] += " not"
            break
        if token.dep == "ROOT":
            verb = {"VBP": "do", "VBZ": "does", "VBD": "did"}.get(token.tag)
            if token.text.lower() in SPECIAL_WORDS:
                texts[index] += " not"
            elif verb is not None:
                texts[index] = f"{verb} not {token.lemma}"
            else:
                texts.insert(0, "Not")
            break
    else:
        texts.insert(0, "Not")
    return " ".join(texts)


# ---------------------------------------------------------------- spaCy


def spacy_missing(model: str, key: str) -> str | None:
    """Why `model` cannot be loaded through spaCy here (with the fix), or None; cheap: nothing is imported."""
    fix = (
        f"Fix: pip install 'sentemb[spacy]' and python -m spacy download {model}, or {key}=rule (the parser-free "
        "approximation, no install)"
    )
    if importlib.util.find_spec("spacy") is None:
        return f"{key}=spacy: spaCy is not installed. {fix}"
    if not (Path(model).expanduser().is_dir() or _importable(model)):
        model_key = key.rpartition(".")[0] + ".spacy_model" if "." in key else "spacy_model"
        return f"{key}=spacy: spaCy's pipeline {model_key}={model} is not installed (nor a folder). {fix}"
    return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing, an empty name
        return False


def load_spacy(model: str = DEFAULT_SPACY_MODEL, key: str = "source") -> Any:
    """spaCy's pipeline `model` (loaded once per process), its named-entity recogniser left out (its own layers in
    spaCy's English pipelines: the tags, dependencies and lemmas the rule reads are the same without it)."""
    problem = spacy_missing(model, key)
    if problem:
        raise SentembConfigError(problem)
    try:
        return _load_spacy(model)
    except (OSError, ImportError, ValueError) as err:
        raise SentembConfigError(
            f"{key}=spacy: spaCy could not load the pipeline {model!r}: {err}. Fix: python -m spacy download {model} "
            f"(a version matching spaCy {_spacy_version()}), or {key}=rule"
        ) from None


@functools.lru_cache(maxsize=2)
def _load_spacy(model: str) -> Any:
    import spacy

    return spacy.load(model, exclude=["ner"])


def _spacy_version() -> str:
    try:
        import spacy

        return spacy.__version__
    except ImportError:
        return "?"


def iter_negate_spacy(
    sentences: Iterable[str],
    model: str = DEFAULT_SPACY_MODEL,
    batch_size: int = SPACY_BATCH_SIZE,
    key: str = "source",
) -> Iterator[str]:
    """`negate_spacy`, one negation at a time as spaCy's `nlp.pipe` parses them (for a progress bar)."""
    nlp = load_spacy(model, key)
    checked = False
    for doc in nlp.pipe(sentences, batch_size=batch_size):
        if not checked and len(doc):
            checked = True
            missing = [name for name in ("DEP", "TAG", "LEMMA") if not doc.has_annotation(name)]
            if missing:
                raise SentembConfigError(
                    f"{key}=spacy: the pipeline {model!r} assigns no {', '.join(missing)} (the rule reads dependency "
                    f"labels, fine-grained tags and lemmas: components {nlp.pipe_names}). Fix: a trained English "
                    "pipeline with a parser, tagger and lemmatizer, e.g. spacy_model=en_core_web_sm"
                )
        yield negate_parsed([ParsedToken(str(t), t.dep_, t.tag_, t.lemma_) for t in doc])


def negate_spacy(
    sentences: Iterable[str], model: str = DEFAULT_SPACY_MODEL, batch_size: int = SPACY_BATCH_SIZE
) -> list[str]:
    """The released rule (`negate_parsed`) on spaCy's parse of each sentence (``nlp.pipe``), as the released code
    does (it parses `line.strip()`; this parses each sentence as given). The negations depend on the spaCy
    pipeline's version. spaCy is imported here only: a SentembConfigError names the fix when it or the pipeline
    is missing."""
    return list(iter_negate_spacy(sentences, model, batch_size))


# ---------------------------------------------------------------- the parser-free approximation

# the auxiliaries, modals and be/have/do forms the approximation negates (lower case); the clitics as spaCy splits
# them off; "ca"/"wo"/"sha"/"ai" only as the first half of can't/won't/shan't/ain't
AUX_FORMS = frozenset(
    {
        "am", "is", "are", "was", "were", "be", "been", "being", "have", "has", "had", "do", "does", "did",
        "can", "could", "will", "would", "shall", "should", "may", "must", "might",
        "'re", "'ve", "'d", "'ll", "'m", "’re", "’ve", "’d", "’ll", "’m",
    }
)  # fmt: skip
BEFORE_NT = frozenset({"ca", "wo", "sha", "ai"})
# "'s" is "is"/"has" after these (else a possessive: "the band's")
S_IS_AFTER = frozenset({"he", "she", "it", "that", "there", "here", "what", "who", "where", "how", "this"})
# a capitalised "May"/"Will" after these (or first) may be the modal; elsewhere it is taken for a name
CLAUSE_STARTS = frozenset("\"'([{“‘«¿¡.!?:;")
# spaCy's special cases among contractions (the first piece keeps the word's case)
SPECIAL_CASES = {
    "cannot": ("can", "not"),
    "can't": ("ca", "n't"),
    "won't": ("wo", "n't"),
    "shan't": ("sha", "n't"),
    "ain't": ("ai", "n't"),
    "let's": ("let", "'s"),
    "gonna": ("gon", "na"),
    "gotta": ("got", "ta"),
    "wanna": ("wan", "na"),
}
CLITICS = ("n't", "'s", "'re", "'ve", "'ll", "'d", "'m")
QUOTES = "'\"”“`‘´’‚„»«"
PUNCT = "…,:;!?¿¡()[]{}<>_#*&。？！，、；：～·"
# split off a word's front: punctuation, quotes, currency and other symbols (unicode categories Sc, So), § % = and
# dashes ("-" only between words: an infix); off its end: punctuation, quotes, symbols, dashes
PREFIXES = frozenset(PUNCT + QUOTES + "§%=—–")
SUFFIXES = frozenset(PUNCT + QUOTES + "—–")
# split off the end of a number: units ("800km", "5G", "50%")
UNITS = frozenset("km m cm mm kg g mg lb lbs oz mph kmh ha kb mb gb KB MB GB TB G M K T %".split())
# words whose final period stays (spaCy's tokenizer exceptions, the common ones; case as written); a word of
# single letters and periods ("U.S.", "e.g.") keeps its period too
ABBREVIATIONS = frozenset(
    "Mr. Mrs. Ms. Messrs. Dr. Prof. St. Jr. Mt. Gen. Gov. Sen. Rep. Rev. Adm. Inc. Ltd. Co. co. Corp. Bros. vs. "
    "Jan. Feb. Mar. Apr. Jun. Jul. Aug. Sep. Sept. Oct. Nov. Dec.".split()
)
INITIALS = re.compile(r"(?:[^\W\d_]\.)+")
ALPHA = r"[^\W\d_]"
INFIX = re.compile(
    rf"(?<=[^\W_])(?:---|--|-|–|—|~)(?={ALPHA})"  # hyphens and dashes before a letter: "well-known"
    r"|(?<=\d)[-+*^](?=[\d-])"  # between digits: "2019-2020"
    rf"|(?<=[^\W_])[:<>=/](?={ALPHA})"  # "km/h"
    rf"|(?<={ALPHA}),(?={ALPHA})"  # "one,two"
    rf"|(?<=[^\W\d_{string.ascii_uppercase}]|[{QUOTES}])\.(?=[A-Z{QUOTES}])"  # "roles.Principal"
    r"|\.\.+"  # an ellipsis inside a word
)


def tokenize_offline(sentence: str) -> list[str]:
    """spaCy's English tokenisation, approximated for common cases: whitespace, then opening punctuation, quotes,
    currency and symbols split off the front, closing punctuation, quotes, symbols, ``n't`` and the clitics (``'s
    're 've 'll 'd 'm``) and a number's unit off the end, a final period unless it follows a capital letter after a
    non-capital ("J.", "GmbH.") or ends an abbreviation ("Mr.", "U.S."), hyphens between words and a few other
    infixes split, and spaCy's special cases (can't → ca n't, won't → wo n't, cannot → can not, let's → let 's).
    Measured on wiki1m's head (data=wiki, 11,914 lines): 99.3% of the lines split exactly as spaCy 3.8.18's
    English tokenizer splits them, its whitespace tokens aside (the rest: URLs, emoticons such as "(;", "Ph.D.",
    units such as "m.")."""
    tokens: list[str] = []
    for chunk in sentence.split():
        tokens += _split_chunk(chunk)
    return tokens


def _symbol(char: str) -> bool:
    return unicodedata.category(char) in ("Sc", "So")


def _split_chunk(chunk: str) -> list[str]:
    front: list[str] = []
    back: list[str] = []
    while chunk:
        special = SPECIAL_CASES.get(chunk.lower().replace("’", "'"))
        if special:
            first = chunk[: len(special[0])]
            return [*front, first, chunk[len(first) :], *back]
        if chunk in ABBREVIATIONS or not chunk.strip("."):  # "Mr.", an ellipsis standing alone
            break
        if len(chunk) > 1 and (
            chunk[0] in PREFIXES or _symbol(chunk[0]) or (chunk[0] == "+" and not chunk[1].isdigit())
        ):
            front.append(chunk[0])
            chunk = chunk[1:]
            continue
        cut = _suffix(chunk)
        if cut:
            back.insert(0, chunk[-cut:])
            chunk = chunk[:-cut]
            continue
        break
    return [*front, *_split_infixes(chunk), *back]


def _suffix(chunk: str) -> int:
    """The length of the suffix spaCy would split off the end of `chunk` (which is longer than it), or 0."""
    plain = chunk.lower().replace("’", "'")
    if len(chunk) > 3 and chunk.endswith("..."):
        return 3
    for clitic in CLITICS:  # after a letter ('s after anything: "2013's", "J.K.'s")
        stem = plain[: -len(clitic)]
        if plain.endswith(clitic) and stem and (stem[-1].isalpha() or clitic == "'s"):
            return len(clitic)
    match = re.search(r"(?<=\d)([^\W\d_]+|%)$", chunk)
    if match and match.group(1) in UNITS:
        return len(match.group(1))
    if len(chunk) < 2:
        return 0
    last = chunk[-1]
    if last in SUFFIXES or _symbol(last) or (last == "+" and chunk[-2].isdigit()):
        return 1
    if last == "." and not _keeps_period(chunk):
        return 1
    return 0


def _keeps_period(chunk: str) -> bool:
    before = chunk[:-1]
    after_capital = before[-1].isupper() and not (len(before) > 1 and before[-2].isupper())
    return after_capital or bool(INITIALS.fullmatch(chunk))


def _split_infixes(core: str) -> list[str]:
    if not core:
        return []
    pieces, start = [], 0
    for match in INFIX.finditer(core):
        if match.start() > start:
            pieces.append(core[start : match.start()])
        pieces.append(match.group())
        start = match.end()
    if start < len(core):
        pieces.append(core[start:])
    return pieces


def _is_aux(tokens: list[str], index: int) -> bool:
    word = tokens[index]
    lower = word.lower().replace("’", "'")
    following = tokens[index + 1].lower().replace("’", "'") if index + 1 < len(tokens) else ""
    if lower in BEFORE_NT:
        return following == "n't"
    if lower == "'s":
        return index > 0 and tokens[index - 1].lower() in S_IS_AFTER
    if lower in ("may", "will") and word[0].isupper() and index > 0 and tokens[index - 1] not in CLAUSE_STARTS:
        return False  # "In May", "Will Smith": a name, not the modal
    return lower in AUX_FORMS


def negate_offline(sentence: str) -> str:
    """A parser-free approximation of the released rule (`negate_parsed`): the sentence tokenised like spaCy for
    common cases (`tokenize_offline`), then the first token ``not`` deleted; else `` not`` appended to the first
    auxiliary, modal or be/have/do form (AUX_FORMS: am is are was were be been being have has had do does did can
    could will would shall should may must might, the clitics 're 've 'd 'll 'm, ca/wo/sha/ai before n't, and
    's after a pronoun such as it/he/that/there); else ``Not`` prepended; the tokens joined by single spaces.

    It agrees with the parse-based rule on 9 of the 15 hand-parsed sentences of tests/test_negation.py. Where the
    two differ:
    - a main verb as ROOT without an auxiliary before it (VBP/VBZ/VBD): the rule gives "do/does/did not <lemma>"
      ("He plays chess." → "He does not play chess ."), the approximation prepends "Not" (it has no tagger nor
      lemmatiser);
    - "have", "has", "had", "do", "does", "did" as main verbs: the rule gives "do/does/did not have|do", the
      approximation appends " not" ("We have two cats." → "We have not two cats .");
    - a ROOT before a later auxiliary (a main verb whose complement or relative clause holds one): the rule negates
      the ROOT ("He said that it would rain." → "He did not say that it would rain ."), the approximation the
      auxiliary ("He said that it would not rain .");
    - a be/have/do form that is not an aux in the parse before the ROOT, e.g. the copula of a subordinate or relative
      clause ("When he was young, he lived in Rome." → rule "... he did not live in Rome .", approximation "When he
      was not young , ..."), or "be"/"been"/"being" as participles and infinitives;
    - the contractions 's and 'm as a copular ROOT: not in the rule's word list, so the rule gives
      "does not be"/"do not be" ("It's a beautiful day." → "It does not be a beautiful day ."), the approximation
      "It 's not a beautiful day .";
    - a ROOT "be"/"been"/"being" (an imperative "Be careful."): the rule prepends "Not" (tag VB), the approximation
      appends " not" ("Be not careful .");
    - spaCy's infinitival "to" (labelled aux) before the ROOT: the rule gives "to not <verb>" ("To win, they
      trained." → "To not win , they trained ."), the approximation ignores "to";
    - 's: possessive or "is"/"has" is guessed from the word before it (a pronoun), the parse knows;
      a capitalised "May"/"Will" after the first word is taken for a name;
    - tokenisation: spaCy's exceptions (abbreviations, emoticons, URLs, numbers with units, ...) are approximated
      for common cases only; a different split changes the spacing of the output, and a "not" glued to something
      spaCy splits off may be missed; spaCy keeps extra whitespace (a double space, a no-break space) as tokens of
      their own, which the rule joins back in, while the approximation drops it.
    """
    tokens = tokenize_offline(sentence)
    if "not" in tokens:
        del tokens[tokens.index("not")]
        return " ".join(tokens)
    for index in range(len(tokens)):
        if _is_aux(tokens, index):
            tokens[index] += " not"
            return " ".join(tokens)
    return " ".join(["Not", *tokens])


# ---------------------------------------------------------------- the released file format


def _fix_file(path: str | os.PathLike) -> str:
    return (
        f"Fix: regenerate it with {REGENERATE.format(path=path)} (each line a JSON list [sentence, negation] of two "
        "strings, as SNCSE's soft_negative_samples.txt)"
    )


def parse_line(text: str, path: str | os.PathLike, number: int) -> tuple[str, str]:
    """One line of a negation file: a JSON list of two strings, [sentence, negation] (plain JSON: nothing is
    evaluated; nesting too deep for the parser is refused, `parse_json`), each of them text a tokenizer takes (no
    lone surrogate from an escape such as "\\ud800", `not_text`); anything else a SentembConfigError naming the
    file, the line and the fix."""
    where = f"{path}, line {number}"
    value = parse_json(text, where, _fix_file(path))
    if not (isinstance(value, list) and len(value) == 2 and all(isinstance(item, str) for item in value)):
        raise SentembConfigError(
            f"{where}: {text.strip()[:80]!r} is not a list of two strings [sentence, negation]. {_fix_file(path)}"
        )
    for role, item in zip(("sentence", "negation"), value, strict=True):
        why = not_text(item)
        if why:
            raise SentembConfigError(f"{where}: the {role} {why}. {_fix_file(path)}")
    return value[0], value[1]


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line, decoded as UTF-8 (a bad byte names its line)."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise SentembConfigError(f"{path}, line {number}: not UTF-8 ({err}). {_fix_file(path)}") from None
            if text.strip():
                yield number, text


def _existing_file(path: str | os.PathLike | None, key: str) -> Path:
    if path is None or not str(path).strip():
        raise SentembConfigError(
            f"{key}.source=file needs {key}.path, the negation file. Fix: {key}.path=<negations.jsonl> (made by "
            "python -m sentemb.negate in=<corpus> out=<negations.jsonl>), or "
            f"{key}.source=rule|spacy to negate the sentences as they are read"
        )
    file = Path(path).expanduser()
    if not file.is_file():
        what = "is a folder, not a file" if file.is_dir() else "does not exist"
        raise SentembConfigError(
            f"{key}.path={path} {what}. Fix: point {key}.path at the negation file, or make it with "
            f"python -m sentemb.negate in=<corpus> out={path}"
        )
    return file


def read_negations(path: str | os.PathLike) -> dict[str, str]:
    """{sentence: negation} from a file of SNCSE's format: JSON lines, each [sentence, negation]. Every line is
    checked (blank lines are skipped); a line that is not JSON, not a list of two strings, an empty file, or a
    sentence given twice with different negations is a SentembConfigError naming the file, the line(s) and the fix.
    A sentence repeated with the same negation (a corpus's duplicate line) is kept once."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise SentembConfigError(
            f"{path}: no such negation file. Fix: make it with python -m sentemb.negate in=<corpus> out={path}"
        )
    table: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for number, text in _lines(file):
        sentence, negation = parse_line(text, path, number)
        if sentence in table:
            if table[sentence] != negation:
                raise SentembConfigError(
                    f"{path}: the sentence {sentence[:80]!r} has two different negations, line "
                    f"{first_line[sentence]} ({table[sentence][:80]!r}) and line {number} ({negation[:80]!r}). "
                    "Fix: delete one of the two lines, or regenerate the file with "
                    f"{REGENERATE.format(path=path)}"
                )
            continue
        table[sentence] = negation
        first_line[sentence] = number
    if not table:
        raise SentembConfigError(f"{path} holds no negation (an empty file). {_fix_file(path)}")
    return table


_TABLES: dict[tuple[str, int, int], dict[str, str]] = {}


def cached_negations(path: str | os.PathLike) -> dict[str, str]:
    """`read_negations(path)`, read once per process while the file keeps its size and modification time (the data
    pipeline asks batch after batch); only the latest file is kept."""
    file = Path(path).expanduser().resolve()
    status = file.stat()
    stamp = (str(file), status.st_size, status.st_mtime_ns)
    if stamp not in _TABLES:
        table = read_negations(path)
        _TABLES.clear()
        _TABLES[stamp] = table
    return _TABLES[stamp]


# ---------------------------------------------------------------- the entry point


def ends_in_punctuation(sentence: str) -> bool:
    """train_SNCSE.py's test: the last character of the stripped sentence is one of string.punctuation."""
    return sentence.strip()[-1:] in PUNCTUATION


def with_final_period(sentence: str) -> str:
    """`sentence` as train_SNCSE.py trains on it (prepare_features, lines 510-512 at faa013e): " ." appended when its
    stripped form does not end in one of string.punctuation (to the sentence as given, spaces kept). An empty
    sentence, where the code would fail, counts as not ending in punctuation."""
    return sentence if ends_in_punctuation(sentence) else sentence + " ."


def quirk_lookup(sentence: str, table: dict[str, str]) -> str:
    """The soft negative train_SNCSE.py feeds for `sentence`, its negations read into `table` (lines 510-516):
    a sentence whose stripped form does not end in one of string.punctuation gets " ." appended *before* the
    lookup (`with_final_period`; the file's keys are the sentences as they are), so it misses and falls back to
    "Not " + sentence + " ."; a sentence missing from the table falls back to "Not " + sentence; and a negation
    whose stripped form does not end in punctuation gets " ." appended. (train_SNCSE.py appends the same " ." to the
    sentence's own two views: `NegationView.anchors` under auxiliary.sncse.convention=reference.)"""
    key = with_final_period(sentence)
    return with_final_period(table.get(key, "Not " + key))


def negate_sentences(
    sentences: list[str],
    source: str,
    path: str | None = None,
    lookup_quirk: bool = False,
    spacy_model: str = DEFAULT_SPACY_MODEL,
    *,
    key_prefix: str = "auxiliary.sncse",
) -> list[str]:
    """Each sentence's soft negative (its negation), in order: the one entry point of the data pipeline.

    source: ``rule`` (`negate_offline`, nothing installed), ``spacy`` (`negate_spacy` with `spacy_model`: the
    released rule) or ``file`` (`read_negations(path)`, read once per process while the file is unchanged). Every
    source negates the stripped sentence and keys it so, as the released generator writes its file (it negates
    `line.strip()`); a sentence is looked up as it is, then stripped (the corpus reader keeps a line's spaces).
    With source=file every sentence must be in the file; a missing one is a SentembConfigError naming the file, the
    count and the first one.

    lookup_quirk: False (default) gives each sentence its negation, as the paper describes. True reproduces
    train_SNCSE.py's lookup (`quirk_lookup`, on the sentence as it is, never stripped): a sentence not ending in
    punctuation gets "Not " + sentence + " ." whatever its negation, as does one with spaces around it (the file's
    keys are stripped), and a negation not ending in punctuation gets " ." appended. The quirk belongs to training's
    lookup, not to the generator, so it applies alike to every source: the rule or spaCy make the table (only for
    the sentences the lookup can hit: no sentence that would miss is parsed) and the same lookup reads it. A file
    must still hold every sentence (a file made from another corpus is refused either way).
    """
    check_source_name(source, key_prefix)
    if source == "file":
        table = cached_negations(_existing_file(path, key_prefix))
        missing = [sentence for sentence in sentences if _lookup(table, sentence) is None]
        if missing:
            raise SentembConfigError(
                f"{key_prefix}.path={path} holds no negation for {len(missing)} of {len(sentences)} sentences, the "
                f"first: {missing[0][:120]!r} (a file made from another corpus, or an older version of it). Fix: "
                f"regenerate it from the training corpus: {REGENERATE.format(path=path)}"
            )
    else:
        if lookup_quirk:  # only a sentence that is its own stripped form and ends in punctuation can be found
            wanted = [s for s in sentences if s == s.strip() and ends_in_punctuation(s)]
        else:
            wanted = [s.strip() for s in sentences]
        unique = list(dict.fromkeys(wanted))
        if source == "spacy":
            negations: Iterable[str] = iter_negate_spacy(unique, spacy_model, key=f"{key_prefix}.source")
        else:
            negations = map(negate_offline, unique)
        table = dict(zip(unique, negations, strict=True))
    if lookup_quirk:
        return [quirk_lookup(sentence, table) for sentence in sentences]
    return [_lookup(table, sentence) for sentence in sentences]


def _lookup(table: dict[str, str], sentence: str) -> str | None:
    """`sentence`'s negation: under the sentence as it is, else as stripped; None if under neither."""
    found = table.get(sentence)
    return found if found is not None else table.get(sentence.strip())


def check_source_name(source: Any, key_prefix: str = "auxiliary.sncse") -> None:
    if source not in SOURCES:
        raise SentembConfigError(
            f"{key_prefix}.source={source!r} is not a source of soft negatives. Fix: {key_prefix}.source=rule "
            "(the parser-free approximation), spacy (the released rule on spaCy's parse) or file (with "
            f"{key_prefix}.path=<negations.jsonl> from python -m sentemb.negate)"
        )


def check_soft_negative_source(
    source: str, path: str | None, spacy_model: str = DEFAULT_SPACY_MODEL, key_prefix: str = "auxiliary.sncse"
) -> None:
    """The soft-negative settings checked in milliseconds, before any model loads: a known source; for source=file
    an existing file whose first non-blank line is a [sentence, negation] pair; for source=spacy spaCy and its
    pipeline installed (found, not loaded). `path` is read only with source=file."""
    check_source_name(source, key_prefix)
    if source == "file":
        file = _existing_file(path, key_prefix)
        first = next(_lines(file), None)
        if first is None:
            raise SentembConfigError(f"{key_prefix}.path={path} holds no negation (an empty file). {_fix_file(path)}")
        parse_line(first[1], path, first[0])
    elif source == "spacy":
        problem = spacy_missing(spacy_model or DEFAULT_SPACY_MODEL, f"{key_prefix}.source")
        if problem:
            raise SentembConfigError(problem)
