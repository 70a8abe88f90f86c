"""`similarities.npz`: the cosine of every scored STS pair of one evaluation, kept beside its results so that
`python -m sentemb.compare` tests two models on the same pairs without encoding them again.

One entry per task and subset (`STS12/MSRpar`, `STSBenchmark/test`): `cosine/<task>/<subset>` (float64, one
per pair) and `pairs/<task>/<subset>`, a digest of the pairs' sentences and gold scores. A stored entry is used
only where its digest is that of the pairs read today: data edited since, or another tokenisation, means the
model is encoded again. The file is input like any other: read without pickle, only the entries of the tasks asked
for, each array's declared shape and type checked in its header before numpy allocates it (a header may declare any
size), its values checked once read, and a file that is not such a record is refused with its name.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np

from sentemb.common.errors import SentembConfigError
from sentemb.common.published_files import published
from sentemb.eval.scorable import check_similarities
from sentemb.eval.sts import SentencePairs

SIMILARITIES_NAME = "similarities.npz"
FIX = "Fix: move the file away (the model is then encoded again) or evaluate the model again"


def pairs_digest(pairs: SentencePairs) -> str:
    """sha256 of the pairs' sentences and gold scores, in order."""
    digest = hashlib.sha256()
    for first, second in zip(pairs.first, pairs.second, strict=True):
        digest.update(first.encode("utf-8") + b"\t" + second.encode("utf-8") + b"\n")
    digest.update(np.ascontiguousarray(pairs.gold, dtype=np.float64).tobytes())
    return digest.hexdigest()


def write_similarities(
    path: Path, data: dict[str, dict[str, SentencePairs]], similarities: dict[str, dict[str, np.ndarray]]
) -> Path:
    """Every task's cosines (`similarities[task][subset]`, scored on `data[task][subset]`) in one file, written
    whole or not at all, never through a link (sentemb.common.published_files)."""
    arrays = {}
    for task, subsets in similarities.items():
        for subset, cosines in subsets.items():
            arrays[f"cosine/{task}/{subset}"] = np.asarray(cosines, dtype=np.float64)
            arrays[f"pairs/{task}/{subset}"] = np.asarray(pairs_digest(data[task][subset]))
    with published(path, "wb") as handle:
        np.savez(handle, **arrays)
    return path


def read_similarities(path: Path, data: dict[str, dict[str, SentencePairs]]) -> dict[str, dict[str, np.ndarray]]:
    """The stored cosines of each task of `data` whose every subset is stored for today's pairs; the tasks it
    lacks (or holds for other pairs) are left out, to be encoded."""
    try:
        with zipfile.ZipFile(path) as archive:
            return {task: kept for task, subsets in data.items() if (kept := stored_task(archive, path, task, subsets))}
    except SentembConfigError:  # a ValueError already naming the file, the entry and the fix
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise SentembConfigError(f"{path}: not a readable {SIMILARITIES_NAME} ({err}). {FIX}") from None


def stored_task(
    archive: zipfile.ZipFile, path: Path, task: str, subsets: dict[str, SentencePairs]
) -> dict[str, np.ndarray] | None:
    """One task's stored cosines, if every subset is stored for today's pairs (None otherwise)."""
    kept = {}
    for subset, pairs in subsets.items():
        digest = stored_array(archive, path, f"pairs/{task}/{subset}", (), "U", DIGEST_CHARS)
        if digest is None or str(digest) != pairs_digest(pairs):
            return None
        cosine = stored_array(archive, path, f"cosine/{task}/{subset}", (len(pairs.gold),), "f", 8)
        if cosine is None:
            return None
        if not np.all(np.abs(cosine) <= 1.0 + 1e-9):
            raise SentembConfigError(
                f"{path}: cosine/{task}/{subset} is not {len(pairs.gold)} cosines in [-1, 1] (float64). {FIX}"
            )
        check_similarities(cosine, f"{path}: cosine/{task}/{subset}")  # all equal: no Spearman to compare
        kept[subset] = cosine
    return kept


DIGEST_CHARS = 64  # a sha256 in hex


def stored_array(
    archive: zipfile.ZipFile, path: Path, name: str, shape: tuple[int, ...], kind: str, size: int
) -> np.ndarray | None:
    """The entry `name` (None: not in the archive), refused unless its header declares `shape` and a dtype of `kind`
    whose items are `size` bytes (float64) or at most `size` characters (a string): read only then, so a header
    declaring 1e10 values allocates nothing."""
    member = f"{name}.npy"
    if member not in archive.namelist():
        return None
    with archive.open(member) as handle:
        version = np.lib.format.read_magic(handle)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{name}: .npy format version {version}, not one np.savez writes")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        declared, _, dtype = read_header(handle)
    fits = dtype.kind == kind and (dtype.itemsize == size if kind == "f" else dtype.itemsize <= 4 * size)
    if declared != shape or not fits:
        raise SentembConfigError(
            f"{path}: {name} declares shape {declared} of {dtype}, where its pairs need {shape} of "
            f"{'float64' if kind == 'f' else f'a string of at most {size} characters'}. {FIX}"
        )
    with archive.open(member) as handle:
        return np.lib.format.read_array(handle, allow_pickle=False)
