"""An ONNX export's artefacts measured against the torch encoder they came from: the model card's table.

On STS-B dev, each artefact's embedding of every sentence is compared with the torch encoder's
(row cosine: min and mean); on STS-B test, each one (the torch encoder included) is scored as
sentemb.evaluate scores it (Spearman x100 of the cosines).
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import numpy as np

from sentemb.eval.sts import STSBenchmark, pairwise_cosine, read_stsb_split


class ArtefactCheck:
    """STS-B dev and test, read when built (a missing file is named before any export work starts)."""

    def __init__(self, stsb_dir: Path) -> None:
        self.dev = read_stsb_split(stsb_dir / "sts-dev.csv")
        self.test = STSBenchmark(stsb_dir, ("test",))

    def measure(self, reference: Any, artefacts: dict[str, Any], batch_size: int = 128) -> dict[str, dict[str, float]]:
        """{name: {cosine_min, cosine_mean, stsb_test_spearman}} for `reference` ("torch") and each artefact
        (anything with SentenceEncoder.encode)."""
        sentences = list(dict.fromkeys(self.dev.first + self.dev.second))
        anchor = reference.encode(sentences, batch_size=batch_size)
        rows = {"torch": {"stsb_test_spearman": self.test.evaluate(reference, batch_size)["test"]["spearman"]}}
        for name, artefact in artefacts.items():
            cosine = pairwise_cosine(artefact.encode(sentences, batch_size=batch_size), anchor)
            rows[name] = {
                "cosine_min": float(np.min(cosine)),
                "cosine_mean": float(np.mean(cosine)),
                "stsb_test_spearman": self.test.evaluate(artefact, batch_size)["test"]["spearman"],
            }
        return rows


def artefact_table(rows: dict[str, dict[str, float]], files: dict[str, str], folder: Path) -> list[str]:
    """The model card's markdown table of `measure`'s rows, with each file and its size."""
    import onnxruntime

    lines = [
        "| artefact | file | size | cosine to torch fp32, STS-B dev (min / mean) | STS-B test Spearman |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        file = files[name]
        # a graph with its .data file; torch weights in one file or several shards
        pattern = "model*.safetensors" if file.endswith(".safetensors") else file + "*"
        size = sum(p.stat().st_size for p in folder.glob(pattern)) / 2**20
        cosine = f"{row['cosine_min']:.6f} / {row['cosine_mean']:.6f}" if "cosine_min" in row else "(reference)"
        lines.append(f"| {name} | `{file}` | {size:.1f} MiB | {cosine} | {row['stsb_test_spearman']:.2f} |")
    return [*lines, "", f"Measured by `sentemb.export` on {cpu_name()}, onnxruntime {onnxruntime.__version__}."]


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if "model name" in line]
    return names[0] if names else platform.processor() or platform.machine()
