"""`similarities.npz`: the cosine of every scored STS pair of one evaluation, kept beside its results so that
`python -m sentemb.compare` tests two models on the same pairs without encoding them again.

One entry per task and subset (`STS12/MSRpar`, `STSBenchmark/test`): `cosine/<task>/<subset>` (float64, one
per pair) and `pairs/<task>/<subset>`, a digest of the pairs' sentences and gold scores. A stored entry is used
only where its digest is that of the pairs read today: data edited since, or another tokenisation, means the
model is encoded again. The file is input like any other: read without pickle, every array's shape and values
checked, and a file that is not such a record is refused with its name.
"""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import numpy as np

from sentemb.common.errors import SentembConfigError
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
    whole or not at all (a temporary file renamed over it)."""
    arrays = {}
    for task, subsets in similarities.items():
        for subset, cosines in subsets.items():
            arrays[f"cosine/{task}/{subset}"] = np.asarray(cosines, dtype=np.float64)
            arrays[f"pairs/{task}/{subset}"] = np.asarray(pairs_digest(data[task][subset]))
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with open(temporary, "wb") as handle:
        np.savez(handle, **arrays)
    os.replace(temporary, path)
    return path


def read_similarities(path: Path, data: dict[str, dict[str, SentencePairs]]) -> dict[str, dict[str, np.ndarray]]:
    """The stored cosines of each task of `data` whose every subset is stored for today's pairs; the tasks it
    lacks (or holds for other pairs) are left out, to be encoded."""
    try:
        stored = np.load(path, allow_pickle=False)
        if not isinstance(stored, np.lib.npyio.NpzFile):  # a lone .npy array under this name
            raise ValueError("one array, not an archive of named arrays")
        with stored:
            arrays = {name: stored[name] for name in stored.files}
        if not all(isinstance(array, np.ndarray) for array in arrays.values()):  # a member np.load returns as bytes
            raise ValueError("an entry that is not a NumPy array")
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise SentembConfigError(f"{path}: not a readable {SIMILARITIES_NAME} ({err}). {FIX}") from None
    found = {}
    for task, subsets in data.items():
        kept = {}
        for subset, pairs in subsets.items():
            cosine, digest = arrays.get(f"cosine/{task}/{subset}"), arrays.get(f"pairs/{task}/{subset}")
            if cosine is None or digest is None or digest.shape != () or str(digest) != pairs_digest(pairs):
                break
            if (
                cosine.dtype != np.float64
                or cosine.shape != (len(pairs.gold),)
                or not np.all(np.abs(cosine) <= 1.0 + 1e-9)
            ):
                raise SentembConfigError(
                    f"{path}: cosine/{task}/{subset} is not {len(pairs.gold)} cosines in [-1, 1] (float64). {FIX}"
                )
            kept[subset] = cosine
        else:
            found[task] = kept
    return found
