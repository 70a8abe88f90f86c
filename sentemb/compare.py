"""`python -m sentemb.compare A B [C ...]`: can two models (or two configurations over seeds) be told apart?

Each of B, C, ... is compared with A, per STS task (STS12–16 'all', STS-B and SICK-R test): one model each, by
the paired bootstrap of the Spearman difference over the same test pairs; several runs each (a sweep
configuration), by the paired t-test over the seeds both ran; Holm-corrected over the tasks of each comparison.
What A, B, ... may be: sentemb.runs.contenders. Prints the table and writes `compare.md` and `compare.json` into a
new folder (`--out`, default outputs/compare/<time>), both or neither (a staging folder renamed into place; an
`--out` inside a folder another live command holds is refused); a model's cosines kept by its run or evaluation are
reused, the others encoded. Procedures: docs/evaluation.md#comparing-two-models.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sentemb.common.errors import SentembConfigError
from sentemb.common.folder_lock import enclosing_locks
from sentemb.common.paths import resolve_data_root
from sentemb.common.process import configure_process
from sentemb.common.published_files import exit_on_sigterm, publish_folder, publish_text, staging_folder
from sentemb.eval.bootstrap import LEVEL, RESAMPLES, SEED, Resampling
from sentemb.eval.cache import EmbeddingCache
from sentemb.eval.comparison import compare_models, compare_seeds
from sentemb.eval.report import TABLE_NAMES, with_interval
from sentemb.eval.scorable import check_similarities
from sentemb.eval.similarities import read_similarities
from sentemb.eval.sts import STS_TASKS, SentencePairs, load_sts_task, pooled_sizes, sts_similarities
from sentemb.runs.contenders import Contender, contender, task_names

CONTENDERS_HELP = (
    "run folders, checkpoints, exported or evaluation folders, or sweep configurations "
    "<sweep folder>:key=value[,key=value]; B, C, ... are each compared with A"
)
TASKS_HELP = "comma-separated STS tasks (default: all seven; over seeds: those every contender's jobs were scored on)"


def main(argv: list[str] | None = None) -> int:
    configure_process()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("contenders", nargs="+", help=CONTENDERS_HELP)
    parser.add_argument("--tasks", default="", help=TASKS_HELP)
    parser.add_argument("--out", type=Path, default=None, help="a new folder (default outputs/compare/<time>)")
    parser.add_argument("--resamples", type=int, default=RESAMPLES)
    parser.add_argument("--seed", type=int, default=SEED, help="the bootstrap's seed")
    parser.add_argument("--level", type=float, default=LEVEL)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--data-dir", default=None, help="the data root (default: $SENTEMB_DATA, then ./data)")
    args = parser.parse_args(argv)
    try:
        with exit_on_sigterm():  # a SIGTERM removes the comparison's staging folder as any failure does
            result = compare(args)
    except SentembConfigError as err:
        print(f"sentemb: {err}", file=sys.stderr)
        return 1
    print(result["markdown"])
    print(f"(written to {result['folder']}/compare.md and compare.json)")
    return 0


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Every input checked and every file read before any model is encoded; then the comparisons, written."""
    if len(args.contenders) < 2:
        raise SentembConfigError(
            f"compare: only {args.contenders[0]} given; name at least two contenders (A B [C ...]), each compared "
            f"with A. Fix: python -m sentemb.compare {args.contenders[0]} <a model or configuration to compare>"
        )
    try:
        resampling = Resampling(args.resamples, args.seed, args.level)
    except ValueError as err:
        raise SentembConfigError(f"compare: --{err}") from None
    contenders = [contender(argument) for argument in args.contenders]
    kinds = {c.kind for c in contenders}
    if len(kinds) > 1:
        raise SentembConfigError(
            "compare: " + ", ".join(f"{c.label} is {describe(c)}" for c in contenders) + ". A model is tested on "
            "the test pairs, several runs over their seeds: compare like with like. Fix: name one job of a sweep "
            "configuration (add its seed=...), or give each model several seeds' runs"
        )
    asked = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in asked if t not in STS_TASKS]
    if unknown:
        raise SentembConfigError(
            f"compare: --tasks: unknown STS task(s) {unknown}. Fix: some of {', '.join(STS_TASKS)}"
        )
    tasks = task_names(contenders, asked)
    if not tasks:
        raise SentembConfigError(
            "compare: the contenders' jobs share no STS test score. Fix: train them with the same eval.test_tasks"
        )
    folder = out_folder(args.out)  # refused now if it exists; made only when the comparison is written
    with enclosing_locks(folder, f"compare: --out {folder}", OUT_IN_USE_FIX):  # held until it is written
        result = comparison(args, contenders, tasks, kinds, resampling)
        markdown = comparison_markdown(result)
        write_comparison(folder, result, markdown)
    return {**result, "markdown": markdown, "folder": folder}


OUT_IN_USE_FIX = "wait for it to finish, or name an --out folder outside it"


def comparison(
    args: argparse.Namespace, contenders: list[Contender], tasks: list[str], kinds: set[str], resampling: Resampling
) -> dict[str, Any]:
    """The comparisons of B, C, ... with A (seeds: from their records; models: from their cosines)."""
    from sentemb.st_modules import check_whole_export  # imports sentence-transformers: only where a folder is one

    for c in contenders:
        if c.model is not None and c.model[0] in ("exported", "onnx"):  # a part-way export: refused before any work
            check_whole_export(c.model[1])
    if kinds == {"seeds"}:
        for c in contenders:
            c.check_scores(tasks)
        lacking = [f"{c.label} ({', '.join(t for t in tasks if t not in (c.seeds or {}))})" for c in contenders
                   if any(t not in (c.seeds or {}) for t in tasks)]  # fmt: skip
        if lacking:
            raise SentembConfigError(
                f"compare: --tasks {','.join(tasks)}: not every job of {'; '.join(lacking)} recorded a test score "
                "of those tasks. Fix: leave --tasks out (the tasks every job was scored on), or train with "
                "eval.test_tasks naming them"
            )
        comparisons = [seed_comparison(contenders[0], other, tasks, args.level) for other in contenders[1:]]
        procedure = {"test": "paired t-test over shared seeds (scipy.stats.ttest_rel)", "correction": "Holm",
                     "level": args.level}  # fmt: skip
    else:
        senteval = resolve_data_root(args.data_dir) / "senteval" / "downstream"
        data = {task: load_sts_task(senteval, task, ("test",)) for task in tasks}
        largest = max(pooled_sizes(data))
        resampling.check_fits(largest, "--resamples")  # before the bootstrap allocates its resamples
        stored = [stored_similarities(c, data) for c in contenders]  # every contender's files, before any encoding
        for c, found in zip(contenders, stored, strict=True):  # then each model to encode passes its loader's checks
            if c.model is not None and any(task not in found for task in data):
                from sentemb.st_modules import check_before_loading

                check_before_loading(*c.model)
        similarities = [model_similarities(c, data, found, args) for c, found in zip(contenders, stored, strict=True)]
        comparisons = [
            {"a": contenders[0].label, "b": other.label,
             "rows": compare_models(data, similarities[0], similarities[i], resampling)}
            for i, other in enumerate(contenders[1:], start=1)
        ]  # fmt: skip
        procedure = {"test": "paired bootstrap over the test pairs", "correction": "Holm", **resampling.as_dict()}
    return {"contenders": [summary(c) for c in contenders], "procedure": procedure, "comparisons": comparisons}


def write_comparison(folder: Path, result: dict[str, Any], markdown: str) -> None:
    """compare.json and compare.md, built in a staging folder beside `folder` and renamed to it: both or neither
    (a comparison stopped part-way leaves no folder, so the same command runs again), and never into a folder
    another command made meanwhile."""
    with staging_folder(folder) as staging:
        publish_text(staging / "compare.json", json.dumps(finite(result), indent=2) + "\n")
        publish_text(staging / "compare.md", markdown + "\n")
        try:
            publish_folder(staging, folder)
        except FileExistsError:  # made by another command while this one compared: never written into
            raise SentembConfigError(f"compare: --out {folder} appeared while comparing. {OUT_FIX}") from None


OUT_FIX = "Fix: name a new --out folder (a comparison writes into a new folder and replaces nothing)"


def out_folder(out: Path | None) -> Path:
    """The comparison's own folder (`--out`, or outputs/compare/<time>); one that exists already is refused."""
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S_") + f"{time.time_ns() // 1000 % 10**6:06d}"  # as run folders are named
    folder = Path(out) if out else Path("outputs") / "compare" / stamp
    if os.path.lexists(folder):  # a link there too, dangling or not: a comparison replaces nothing
        raise SentembConfigError(f"compare: --out {folder} exists. {OUT_FIX}")
    return folder


def describe(c: Contender) -> str:
    return f"{len(c.jobs)} runs (seeds)" if c.kind == "seeds" else "one model"


def summary(c: Contender) -> dict[str, Any]:
    return {"label": c.label, "kind": c.kind, "model": [c.model[0], str(c.model[1])] if c.model else None,
            "jobs": c.jobs}  # fmt: skip


def seed_comparison(a: Contender, b: Contender, tasks: list[str], level: float) -> dict[str, Any]:
    picked_a = {t: (a.seeds or {})[t] for t in tasks}
    picked_b = {t: (b.seeds or {})[t] for t in tasks}
    return {"a": a.label, "b": b.label, "rows": compare_seeds(picked_a, picked_b, level)}


def stored_similarities(c: Contender, data: dict[str, dict[str, SentencePairs]]) -> dict[str, dict[str, Any]]:
    """{task: {subset: cosines}} kept by the contender for today's pairs; a task it lacks without a model to
    encode it is refused here, before any contender is encoded."""
    found: dict[str, dict[str, Any]] = {}
    for path in c.cached:
        found |= {t: v for t, v in read_similarities(path, data).items() if t not in found}
    missing = [task for task in data if task not in found]
    if missing and c.model is None:
        raise SentembConfigError(
            f"compare: {c.label} holds no cosines for {', '.join(missing)} and names no model to encode them. "
            f"Fix: evaluate it on them (python -m sentemb.evaluate ... tasks={','.join(missing)})"
        )
    if missing and not c.model[1].exists():
        raise SentembConfigError(
            f"compare: {c.label}: {c.model[1]} does not exist, and {', '.join(missing)} must be encoded with it. "
            "Fix: restore the file, or compare on the tasks it holds cosines for (--tasks)"
        )
    return found


def model_similarities(
    c: Contender, data: dict[str, dict[str, SentencePairs]], found: dict[str, dict[str, Any]],
    args: argparse.Namespace,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """{task: {subset: cosines}}: the stored ones (`found`, from `stored_similarities`), the rest encoded now."""
    found = dict(found)
    missing = {task: subsets for task, subsets in data.items() if task not in found}
    if missing:
        encoder = load_model(c, args)
        print(f"compare: encoding {', '.join(missing)} with {c.label}", file=sys.stderr)
        cache = EmbeddingCache(encoder, batch_size=args.batch_size, show_progress=False)
        cache.prefetch(s for subsets in missing.values() for p in subsets.values() for s in p.first + p.second)
        for task, subsets in missing.items():
            found[task] = sts_similarities(subsets, cache)
            for subset, cosines in found[task].items():  # a collapsed model: refused, never a NaN row
                check_similarities(cosines, f"compare: {c.label}, encoded now: {task} {subset}")
    return found


def load_model(c: Contender, args: argparse.Namespace) -> Any:
    """The encoder of a contender: a checkpoint's, an exported folder's (through its checked loader), an ONNX
    export's."""
    kind, path = c.model
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if kind == "checkpoint":
        from sentemb.encoders.build import load_checkpoint_encoder

        return load_checkpoint_encoder(path, device)[0]
    if kind == "onnx":
        from omegaconf import OmegaConf

        from sentemb.eval.suite import onnx_artefact

        return onnx_artefact(OmegaConf.create({"onnx": str(path)}))
    from sentemb.st_modules import load_exported_folder

    return ExportedEncoder(load_exported_folder(path, device=str(device)))


class ExportedEncoder:
    """A sentence-transformers model behind the `encode` sentemb's evaluation calls."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def encode(
        self, sentences: list[str], batch_size: int = 128, max_length: int | None = None, show_progress: bool = False
    ) -> np.ndarray:
        return self.model.encode(
            sentences, batch_size=batch_size, show_progress_bar=show_progress, convert_to_numpy=True
        )


def finite(value: Any) -> Any:
    """JSON has no NaN: an undefined number (no test, one seed) is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    return value


def comparison_markdown(result: dict[str, Any]) -> str:
    procedure = result["procedure"]
    lines = ["# Comparison", ""]
    lines += [f"- {chr(65 + i)}: `{c['label']}` ({c['kind']})" for i, c in enumerate(result["contenders"])]
    lines += ["", f"Test: {procedure['test']}; {procedure['correction']}-corrected over the tasks of each comparison"
              + (f"; {procedure['resamples']} resamples, seed {procedure['seed']}" if "resamples" in procedure else "")
              + f". Brackets: {round(100 * procedure['level'])}% intervals. "
              "separable: Holm-adjusted p < 0.05."]  # fmt: skip
    for index, comparison in enumerate(result["comparisons"], start=1):
        b = chr(65 + index)
        lines += ["", f"## A vs {b}", "", f"| task | A | {b} | A − {b} | p | p (Holm) | separable |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in comparison["rows"]:
            cells = [
                TABLE_NAMES.get(row["task"], row["task"]),
                with_interval(row["a"]["estimate"], row["a"]),
                with_interval(row["b"]["estimate"], row["b"]),
                with_interval(row["difference"]["estimate"], row["difference"]),
                p_text(row["p"]), p_text(row["p_holm"]),
                {True: "yes", False: "no", None: "no test"}[row["separable"]],
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def p_text(p: float) -> str:
    return "–" if p is None or math.isnan(p) else f"{p:.3g}"


if __name__ == "__main__":
    sys.exit(main())
