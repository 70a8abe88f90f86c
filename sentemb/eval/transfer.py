"""SentEval's seven transfer tasks with scikit-learn logistic regression (accuracy ×100).

Protocols (SentEval's `tools/validation.py`, `usepytorch=False`):
- MR, CR, SUBJ, MPQA: k-fold cross-validation; in each outer fold C is chosen by an inner
  k-fold on the training part, C ∈ {2^-2 … 2^3}; report the mean outer-fold accuracy.
- SST-2: C ∈ {2^-2 … 2^3} chosen on dev, refit on train, accuracy on test.
- TREC (6 coarse classes) and MRPC: C ∈ {2^-1 … 2^5} chosen by k-fold on train, refit, test
  accuracy (and F1 for MRPC, on features [|u−v|, u⊙v] as SentEval builds them).
Samples are sorted by length as SentEval sorts them before folding (the folds depend on it),
read with SentEval's encodings, whitespace-tokenised and re-joined. `full` uses k = 10
(SimCSE's setting) and the whole C grid; `fast` k = 5 and every other C.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from joblib import Parallel, delayed
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.model_selection import StratifiedKFold

from sentemb.common.errors import SentembConfigError
from sentemb.eval.bootstrap import Resampling
from sentemb.eval.scorable import check_labels
from sentemb.eval.significance import t_interval

TRANSFER_TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
BINARY_FILES = {
    "MR": ("MR", "rt-polarity.pos", "rt-polarity.neg"),
    "CR": ("CR", "custrev.pos", "custrev.neg"),
    "SUBJ": ("SUBJ", "subj.objective", "subj.subjective"),
    "MPQA": ("MPQA", "mpqa.pos", "mpqa.neg"),
}
TREC_CLASSES = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
INNER_KFOLD_C = tuple(2.0**t for t in range(-2, 4))
KFOLD_C = tuple(2.0**t for t in range(-1, 6))
SEED = 1111


@dataclass(frozen=True)
class Labelled:
    """Sentences (or sentence pairs: `second` set) with integer labels; `source`: the file(s) read."""

    first: list[str]
    labels: np.ndarray
    second: list[str] | None = None
    source: str = "the examples"


def _lines(path: Path, encoding: str) -> list[str]:
    if not path.is_file():
        raise SentembConfigError(
            f"SentEval file {path} does not exist. Fix: point SENTEMB_DATA (or paths.data_dir) at a data root "
            "holding senteval/downstream/ (docs/data.md), or run `make data`."
        )
    return path.read_text(encoding=encoding).splitlines()


def _join(tokens: list[str]) -> str:
    return " ".join(tokens)


def read_binary(directory: Path, positive: str, negative: str) -> Labelled:
    """Two latin-1 files of one sentence per line; SentEval orders by (token count, label)."""
    pos = [line.split() for line in _lines(directory / positive, "latin-1")]
    neg = [line.split() for line in _lines(directory / negative, "latin-1")]
    ordered = sorted(zip(pos + neg, [1] * len(pos) + [0] * len(neg), strict=True), key=lambda z: (len(z[0]), z[1]))
    source = f"{directory / positive} and {negative}"
    return Labelled([_join(t) for t, _ in ordered], np.array([y for _, y in ordered]), source=source)


def read_sst2(directory: Path, split: str) -> Labelled:
    path = directory / "SST" / "binary" / f"sentiment-{split}"
    rows = []
    for number, line in enumerate(_lines(path, "utf-8"), start=1):
        columns = line.strip().split("\t")
        if len(columns) != 2 or columns[1] not in ("0", "1"):
            raise SentembConfigError(f"{path}:{number}: expected 'sentence<TAB>0|1'. Fix: restore the SentEval file.")
        rows.append((columns[0].split(), int(columns[1])))
    rows.sort(key=lambda z: (len(z[0]), z[1]))
    return Labelled([_join(t) for t, _ in rows], np.array([y for _, y in rows]), source=str(path))


def read_trec(path: Path) -> Labelled:
    """`COARSE:fine question` lines (latin-1); the coarse class is the label."""
    rows = []
    for number, line in enumerate(_lines(path, "latin-1"), start=1):
        target, _, rest = line.strip().partition(":")
        if target not in TREC_CLASSES or " " not in rest:
            raise SentembConfigError(f"{path}:{number}: expected 'CLASS:fine question' with CLASS in {TREC_CLASSES}.")
        rows.append((rest.split(" ", 1)[1].split(), TREC_CLASSES.index(target)))
    rows.sort(key=lambda z: (len(z[0]), z[1]))
    return Labelled([_join(t) for t, _ in rows], np.array([y for _, y in rows]), source=str(path))


def read_mrpc(path: Path) -> Labelled:
    """Header, then Quality, #1 ID, #2 ID, #1 String, #2 String; ordered by (len A, len B, label)."""
    rows = []
    for number, line in enumerate(_lines(path, "utf-8")[1:], start=2):
        columns = line.strip().split("\t")
        if len(columns) < 5 or columns[0] not in ("0", "1"):
            raise SentembConfigError(f"{path}:{number}: expected 5 tab-separated columns starting with 0|1.")
        rows.append((columns[3].split(), columns[4].split(), int(columns[0])))
    rows.sort(key=lambda z: (len(z[0]), len(z[1]), z[2]))
    second = [_join(b) for _, b, _ in rows]
    return Labelled([_join(a) for a, _, _ in rows], np.array([y for _, _, y in rows]), second, str(path))


def load_transfer_task(senteval_dir: Path, task: str) -> dict[str, Labelled]:
    if task in BINARY_FILES:
        folder, positive, negative = BINARY_FILES[task]
        return {"all": read_binary(senteval_dir / folder, positive, negative)}
    if task == "SST2":
        return {split: read_sst2(senteval_dir, split) for split in ("train", "dev", "test")}
    if task == "TREC":
        return {"train": read_trec(senteval_dir / "TREC" / "train_5500.label"),
                "test": read_trec(senteval_dir / "TREC" / "TREC_10.label")}  # fmt: skip
    if task == "MRPC":
        return {split: read_mrpc(senteval_dir / "MRPC" / f"msr_paraphrase_{split}.txt") for split in ("train", "test")}
    raise SentembConfigError(f"unknown transfer task {task!r}; valid: {list(TRANSFER_TASKS)}")


def _fit(x: np.ndarray, y: np.ndarray, c: float) -> LogisticRegression:
    # lbfgs (scikit-learn's default) to convergence; SentEval's LogisticRegression(C, random_state=seed)
    return LogisticRegression(C=c, random_state=SEED, max_iter=1000).fit(x, y)


def _fit_score(x, y, train, test, c) -> float:
    return _fit(x[train], y[train], c).score(x[test], y[test])


def _cv_mean_accuracy(x, y, k, cs, jobs) -> list[float]:
    """Mean k-fold accuracy ×100 (rounded to 2 decimals, as SentEval) for each C."""
    folds = list(StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED).split(x, y))
    scores = Parallel(n_jobs=jobs)(delayed(_fit_score)(x, y, tr, te, c) for c in cs for tr, te in folds)
    per_c = np.asarray(scores).reshape(len(cs), k)
    return [round(100 * float(np.mean(row)), 2) for row in per_c]


def inner_kfold(x: np.ndarray, y: np.ndarray, k: int, cs: tuple[float, ...], jobs: int = 1) -> dict[str, Any]:
    """MR/CR/SUBJ/MPQA: outer k folds; C chosen by an inner k-fold on each outer training part. `interval`: the
    t-interval of the mean over the outer folds' test accuracies (the papers' std over folds, as an interval)."""
    dev, test = [], []
    for train, held_out in StratifiedKFold(n_splits=k, shuffle=True, random_state=SEED).split(x, y):
        scores = _cv_mean_accuracy(x[train], y[train], k, cs, jobs)
        best = int(np.argmax(scores))
        dev.append(scores[best])
        test.append(round(100 * _fit(x[train], y[train], cs[best]).score(x[held_out], y[held_out]), 2))
    interval = t_interval(test)
    return {
        "devacc": round(float(np.mean(dev)), 2),
        "acc": round(float(np.mean(test)), 2),
        "folds": test,
        "interval": interval.as_dict(),
        "interval_kind": f"t over {k} folds",
    }


def kfold_then_test(train_x, train_y, test_x, test_y, k, cs, jobs=1) -> tuple[dict[str, float], np.ndarray]:
    """TREC/MRPC: C chosen by k-fold on train, refit on all of train, scored on test."""
    scores = _cv_mean_accuracy(train_x, train_y, k, cs, jobs)
    best = int(np.argmax(scores))
    clf = _fit(train_x, train_y, cs[best])
    predicted = clf.predict(test_x)
    return {"devacc": scores[best], "acc": round(100 * float(np.mean(predicted == test_y)), 2)}, predicted


def split_validation(train, dev, test, cs, jobs=1) -> tuple[dict[str, float], np.ndarray]:
    """SST-2: C chosen on dev, the classifier trained on train scored on test."""
    (train_x, train_y), (dev_x, dev_y), (test_x, test_y) = train, dev, test
    models = Parallel(n_jobs=jobs)(delayed(_fit)(train_x, train_y, c) for c in cs)
    scores = [round(100 * m.score(dev_x, dev_y), 2) for m in models]
    best = int(np.argmax(scores))
    predicted = models[best].predict(test_x)
    return {"devacc": scores[best], "acc": round(100 * float(np.mean(predicted == test_y)), 2)}, predicted


def held_out_interval(predicted: np.ndarray, labels: np.ndarray, resampling: Resampling) -> dict[str, Any]:
    """SST-2, TREC, MRPC (one test set, no folds): the bootstrap interval of test accuracy over the test examples."""
    interval = resampling.accuracy(predicted == labels)
    return {"interval": interval.as_dict(), "interval_kind": f"bootstrap over {len(labels)} test examples"}


def mrpc_features(a: np.ndarray, b: np.ndarray, kind: str = "senteval") -> np.ndarray:
    """SentEval's [|u−v|, u⊙v]; `concat` adds u and v ([|u−v|, u⊙v, u, v])."""
    parts = [np.abs(a - b), a * b] + ([a, b] if kind == "concat" else [])
    return np.concatenate(parts, axis=1)


def check_mode(mode: str) -> None:
    """`mode`: full (SentEval's 10 folds) or fast (5 folds, every other C)."""
    if mode not in ("full", "fast"):
        raise SentembConfigError(f"mode={mode!r}: use 'full' (SentEval, k=10) or 'fast' (k=5, fewer C values)")


def folds(mode: str) -> int:
    """k of the k-fold cross-validations: SentEval's 10 (full), or 5 (fast)."""
    return 10 if mode == "full" else 5


def check_transfer_task(task: str, data: dict[str, Labelled], mode: str) -> None:
    """The task's examples checked before any model loads, so its accuracy can be computed (sentemb.eval.scorable):
    every split has examples; the data a classifier is fitted on has two classes at least, each with an example in
    every fold of its k-fold (MR/CR/SUBJ/MPQA nest a k-fold in each outer training part: 2k per class suffice)."""
    k = folds(mode)
    fitted = {"all": 2 * k, "train": 1 if task == "SST2" else k}  # SST-2 picks C on dev: no folds
    for split, labelled in data.items():
        check_labels(labelled.labels, labelled.source, fitted.get(split, 0))


def run_transfer_task(
    task: str, data: dict[str, Labelled], embed: Callable[[list[str]], np.ndarray], mode: str = "full",
    jobs: int = 1, mrpc: str = "senteval", resampling: Resampling | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Test accuracy ×100 (and its interval, see `inner_kfold` and `held_out_interval`) of one task."""
    check_mode(mode)
    check_transfer_task(task, data, mode)
    resampling = resampling or Resampling()
    k = folds(mode)
    thin = (lambda cs: cs) if mode == "full" else (lambda cs: cs[::2])
    if task in BINARY_FILES:
        d = data["all"]
        return {**inner_kfold(embed(d.first), d.labels, k, thin(INNER_KFOLD_C), jobs), "n": len(d.labels)}
    if task == "SST2":
        splits = [(embed(data[s].first), data[s].labels) for s in ("train", "dev", "test")]
        scores, predicted = split_validation(*splits, thin(INNER_KFOLD_C), jobs)
        labels = data["test"].labels
        return {**scores, **held_out_interval(predicted, labels, resampling), "n": len(labels)}
    train, test = data["train"], data["test"]
    if task == "TREC":
        scores, predicted = kfold_then_test(embed(train.first), train.labels, embed(test.first), test.labels, k,
                                    thin(KFOLD_C), jobs)  # fmt: skip
        return {**scores, **held_out_interval(predicted, test.labels, resampling), "n": len(test.labels)}
    train_x = mrpc_features(embed(train.first), embed(train.second), mrpc)
    test_x = mrpc_features(embed(test.first), embed(test.second), mrpc)
    scores, predicted = kfold_then_test(train_x, train.labels, test_x, test.labels, k, thin(KFOLD_C), jobs)
    f1 = round(100 * float(f1_score(test.labels, predicted)), 2)
    return {**scores, "f1": f1, **held_out_interval(predicted, test.labels, resampling), "n": len(test.labels)}


def transfer_sentences(data: dict[str, Labelled]) -> list[str]:
    return [s for d in data.values() for s in d.first + (d.second or [])]
