"""SentEval's STS and transfer tasks for a checkpoint or any HF model (`python -m sentemb.evaluate`, and export).

Writes `results.json` and `results.md` into the run directory and prints the tables. All
task data is read (and checked) before the model is loaded; every distinct sentence of
every requested task is encoded once, through the same `encode()` training uses. A score that
cannot be computed is refused (sentemb.eval.scorable): its input when read, a model output that
leaves it undefined once encoded; results.json never holds a NaN.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, ListConfig, OmegaConf

from sentemb.common.config_fields import refuse_empty_paths
from sentemb.common.errors import SentembConfigError
from sentemb.common.file_values import Shape, parse_yaml, read_json
from sentemb.common.hydra_plumbing import part_name, resolved_container
from sentemb.common.numbers import Bounds, require_whole
from sentemb.common.paths import resolve_data_root
from sentemb.common.published_files import publish_text
from sentemb.common.wandb_mode import wandb_mode
from sentemb.data.labelled import in_domain_note
from sentemb.encoders.build import build_encoder, check_checkpoint_parts, encoder_from_checkpoint
from sentemb.encoders.checkpoint import model_label, read_checkpoint
from sentemb.encoders.encoder import SentenceEncoder
from sentemb.encoders.serving.onnx_embedder import RECIPE, OnnxEncoder
from sentemb.eval.bootstrap import Resampling
from sentemb.eval.cache import EmbeddingCache
from sentemb.eval.figures import similarity_density_figure
from sentemb.eval.geometry import alignment_uniformity, check_geometry_pairs
from sentemb.eval.report import markdown_report
from sentemb.eval.scorable import finite_record
from sentemb.eval.scored_checkpoint import SCORED, checkpoint_identity
from sentemb.eval.similarities import SIMILARITIES_NAME, write_similarities
from sentemb.eval.sts import (
    STS_TASKS,
    Embed,
    SentencePairs,
    load_sts_task,
    pairwise_cosine,
    pooled_sizes,
    score_similarities,
    sts_intervals,
    sts_similarities,
    table_figure,
    table_score,
)
from sentemb.eval.timing import Stopwatch
from sentemb.eval.transfer import (
    TRANSFER_TASKS,
    Labelled,
    check_mode,
    check_transfer_task,
    load_transfer_task,
    run_transfer_task,
    transfer_sentences,
)
from sentemb.eval.truncation import check_truncate_dim, declared_width, trained_sizes, truncated
from sentemb.eval.whitening import TASK as WHITEN_TASK
from sentemb.eval.whitening import (
    check_dim_fits,
    check_whitening_dim,
    embedding_size,
    whitened_embeds,
    whitening_corpus,
)

TASK_GROUPS = {"sts": list(STS_TASKS), "transfer": list(TRANSFER_TASKS), "all": [*STS_TASKS, *TRANSFER_TASKS]}


def resolve_tasks(spec: str | list[str]) -> list[str]:
    """`sts`, `transfer`, `all`, or task names (a list or comma-separated)."""
    if isinstance(spec, ListConfig | list | tuple):
        names = [str(n) for n in spec]
    else:
        names = [n.strip() for n in str(spec).split(",") if n.strip()]
    tasks: list[str] = []
    valid = [*TASK_GROUPS, *STS_TASKS, *TRANSFER_TASKS]
    for name in names:
        if name in TASK_GROUPS:
            tasks += TASK_GROUPS[name]
        elif name in valid:
            tasks.append(name)
        else:
            raise SentembConfigError(f"tasks: unknown task {name!r}. Valid: {', '.join(valid)}")
    return list(dict.fromkeys(tasks))


def asked_parts(cfg: DictConfig) -> dict[str, Any]:
    """The model / pooling / head configs the command line set (`pooling=mean`, `pooling.mlp=always`, ...)."""
    hydra = cfg.hydra if "hydra" in cfg else HydraConfig.get() if HydraConfig.initialized() else None
    overrides = [str(o) for o in OmegaConf.select(hydra, "overrides.task", default=[])] if hydra is not None else []
    if not any(o.startswith("checkpoint=") for o in overrides):  # not the overrides of this command's checkpoint=
        return {}
    groups = {o.lstrip("+~").split("=", 1)[0].split(".", 1)[0].split("@", 1)[0] for o in overrides}
    return {part: resolved_container(cfg.get(part)) for part in ("model", "pooling", "head") if part in groups}


def served_checkpoint(cfg: DictConfig) -> dict[str, Any] | None:
    """`checkpoint=`, read with nothing in it run (tensors left on disk), whole and a sentemb checkpoint, whose
    model / pooling / head are those the command line asks for, if it asks; None without a checkpoint."""
    if not cfg.get("checkpoint"):
        return None
    checkpoint = read_checkpoint(cfg.checkpoint, key="checkpoint", mmap=True)
    fix = "drop the model= / pooling= / head= overrides (a checkpoint is served with the parts it was trained with)"
    check_checkpoint_parts(checkpoint["hyper_parameters"], asked_parts(cfg), cfg.checkpoint, "checkpoint", fix)
    return checkpoint


def load_encoder(
    cfg: DictConfig, device: torch.device, checkpoint: dict[str, Any] | None = None
) -> tuple[SentenceEncoder | OnnxEncoder, dict[str, Any], dict[str, Any]]:
    """The checkpoint's own encoder + pooling (`checkpoint`: already read by `served_checkpoint`), or model= with
    pooling=: (encoder, its source for the record, the checkpoint's hyper-parameters or {})."""
    if cfg.get("onnx"):
        encoder = onnx_artefact(cfg)
        graph = str(encoder.file.relative_to(encoder.folder.resolve()))
        return encoder, {"onnx": str(encoder.folder), "graph": graph, "pooling": {"name": encoder.pooling}}, {}
    if cfg.checkpoint:
        path = Path(cfg.checkpoint).expanduser()
        encoder, hparams = encoder_from_checkpoint(checkpoint or served_checkpoint(cfg), device)
        source = {"checkpoint": str(path), **{key: hparams.get(key) for key in ("model", "pooling", "head")}}
        return encoder, source, hparams
    model, pooling = resolved_container(cfg.model), resolved_container(cfg.pooling)
    head = resolved_container(cfg.get("head"))  # sentemb.export takes head=sarcse (an untrained head)
    return build_encoder(model, pooling, head).to(device), {"model": model, "pooling": pooling, "head": head}, {}


def onnx_artefact(cfg: DictConfig) -> OnnxEncoder:
    """onnx=: an exported folder (its fp32 graph) or a .onnx file inside one, through the folder's loader."""
    path = Path(cfg.onnx).expanduser()
    folders = [path] if path.is_dir() else [p for p in path.parents if (p / RECIPE).is_file()][:1]
    if (
        not path.exists()
        or not folders
        or not (folders[0] / RECIPE).is_file()
        or (path.is_file() and path.suffix != ".onnx")
    ):
        raise SentembConfigError(
            f"onnx={cfg.onnx}: not a folder written by `python -m sentemb.export format=onnx` (no {RECIPE} in it) nor "
            "a .onnx file inside one. Fix: onnx=<that folder> or onnx=<that folder>/onnx/model_qint8.onnx"
        )
    file = str(path.relative_to(folders[0])) if path.is_file() else None
    recipe = read_json(folders[0] / RECIPE, ONNX_RECIPE_SHAPE, ONNX_FIX)  # the one rule; the loader takes it as read
    try:
        return OnnxEncoder(folders[0], file=file, recipe=recipe)
    except (ValueError, KeyError, TypeError) as err:  # the loader's own refusals (a graph outside its folder, ...)
        raise SentembConfigError(f"onnx={cfg.onnx}: {err}. {ONNX_FIX}") from None


# results.json read back (the card of sentemb.export, sentemb.compare): its source's part configs may be
# results of issue-37-or-older runs, which named their parts by `_target_` (shown or compared, never built)
RESULTS_SHAPE = Shape(targets=("source.model.backbone", "source.model.tokenizer", "source.pooling", "source.head"))
ONNX_RECIPE_SHAPE = Shape(
    keys={
        "": (
            "format", "graphs", "output", "dimension", "pooling", "padding_side", "truncation_side", "pad_token_id",
            "rows", "disabled_optimizers",
        )
    }
)  # fmt: skip
ONNX_FIX = "Fix: export the folder again (python -m sentemb.export ... format=onnx)"


# sentences encoded together, tokens kept of each, and processes fitting the transfer tasks' classifiers (-1: all cores)
EVAL_SIZES = {
    "batch_size": (Bounds(1, 2**16), "batch_size=128"),
    "max_length": (Bounds(1, 2**17), "max_length=null (the pooling's, else the tokenizer's limit), or e.g. 128"),
    "jobs": (Bounds(-1, 256), "jobs=2 (-1: every core)"),
}


def check_evaluation_truncation(cfg: DictConfig, checkpoint: dict[str, Any] | None) -> int | None:
    """eval.truncate_dim (null: the whole vector) against the sentence vector's width the checkpoint's or the command
    line's model and head declare, before any model loads; a size the checkpoint's matryoshka.dims did not train is
    warned about."""
    size = OmegaConf.select(cfg, "eval.truncate_dim", default=None)
    if size is None:
        return None
    hparams = checkpoint["hyper_parameters"] if checkpoint else None
    parts = hparams or {key: resolved_container(cfg.get(key)) for key in ("model", "head")}
    width = None if cfg.get("onnx") else declared_width(parts["model"], parts.get("head"))
    return check_truncate_dim(size, "eval.truncate_dim", width, trained_sizes(hparams))


def check_evaluation_sizes(cfg: DictConfig) -> None:
    """batch_size, max_length (null: the model's) and jobs: whole numbers within their bounds, named before anything
    loads (`batch_size=abc` would otherwise fail in the first batch, after the model loaded)."""
    for key, (bounds, fix) in EVAL_SIZES.items():
        value = cfg.get(key)
        if value is None and key == "max_length":
            continue
        require_whole(key, value, bounds, fix)
        if key == "jobs" and value == 0:
            raise SentembConfigError(f"jobs=0 runs no process. Fix: {fix}")


def evaluate(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    refuse_empty_paths(cfg)
    check_evaluation_sizes(cfg)
    if cfg.get("onnx") and cfg.get("checkpoint"):
        raise SentembConfigError(
            f"onnx={cfg.onnx} with checkpoint={cfg.checkpoint}: evaluate one of them. Fix: drop checkpoint= or onnx="
        )
    # BERT-whitening of the STS tasks: null, task, or a corpus file (read now); export checks both keys the same way
    whitening, whitening_dim = cfg.get("whitening"), cfg.get("whitening_dim")
    check_whitening_dim(whitening, whitening_dim)  # first: a bad key costs nothing else
    # the file's identity before it is read: a file replaced meanwhile never passes for the one scored
    scored = checkpoint_identity(cfg.checkpoint) if cfg.get("checkpoint") and is_file(cfg.checkpoint) else None
    checkpoint = served_checkpoint(cfg)  # first: a bad or mismatched checkpoint costs nothing else
    truncate_dim = check_evaluation_truncation(cfg, checkpoint)  # eval.truncate_dim against the declared width
    in_domain = run_in_domain_note(cfg.get("checkpoint"))  # its run's .hydra/config.yaml, read before the model loads
    tasks = resolve_tasks(cfg.tasks)
    senteval_dir = resolve_data_root(cfg.paths.data_dir) / "senteval" / "downstream"
    sts_data = {task: load_sts_task(senteval_dir, task, cfg.sts_splits) for task in tasks if task in STS_TASKS}
    transfer_data = {task: load_transfer_task(senteval_dir, task) for task in tasks if task in TRANSFER_TASKS}
    if transfer_data:
        check_mode(cfg.mode)  # before the model loads
        for task, data in transfer_data.items():  # an accuracy the data leaves undefined: refused now
            check_transfer_task(task, data, cfg.mode)
    if cfg.align_uniform_split in sts_data.get("STSBenchmark", {}):
        fix = "Fix: align_uniform_split=<an STS-B split with positive pairs>, or align_uniform_split=null"
        check_geometry_pairs(sts_data["STSBenchmark"][cfg.align_uniform_split], fix)
    figure_pairs = load_sts_task(senteval_dir, "STSBenchmark", ["test"])["test"] if cfg.figure else None
    resampling = Resampling.from_settings(cfg.get("intervals"), "intervals")  # before the model loads
    resampling.check_fits(largest_resample(sts_data, transfer_data), "intervals.resamples")
    corpus = whitening_corpus(whitening, whitening_dim) if whitening and whitening != WHITEN_TASK else None
    corpus_lines = corpus.sentences if corpus else []
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" else cfg.device)

    encoder, source, _ = load_encoder(cfg, device, checkpoint)
    if truncate_dim is not None:  # the width no config declared (an ONNX folder, a hub model not stored): now
        check_truncate_dim(truncate_dim, "eval.truncate_dim", embedding_size(encoder, "A sentence."))
        encoder = truncated(encoder, truncate_dim)
    check_whitening_fits(encoder, whitening_dim, sts_data)  # the embedding's size is known now, before any encoding
    clock = Stopwatch()
    cache = EmbeddingCache(encoder, batch_size=cfg.batch_size, max_length=cfg.max_length)
    with clock("encode"):
        cache.prefetch(
            [s for subsets in sts_data.values() for pairs in subsets.values() for s in pairs.first + pairs.second]
            + [s for data in transfer_data.values() for s in transfer_sentences(data)]
            + (figure_pairs.first + figure_pairs.second if figure_pairs else [])
            + corpus_lines
        )

    results: dict[str, Any] = {"source": source, "tasks": tasks, "sentences_encoded": len(cache)}
    if truncate_dim is not None:  # every score below is of the first truncate_dim dimensions
        results["truncate_dim"] = truncate_dim
    if scored is not None:  # which file was scored: a model card shows these results only beside that file
        results[SCORED] = scored
    if in_domain is not None:
        results["in_domain"] = in_domain
    results["intervals"] = resampling.as_dict()  # the STS intervals' and the transfer test sets' bootstrap
    embeds = whitened_embeds(whitening, whitening_dim, sts_data, cache, corpus_lines)
    if whitening:
        results["whitening"] = {"fitted_on": whitening, "dim": whitening_dim, "tasks": sorted(embeds)}
    if sts_data:
        results |= score_sts(sts_data, embeds, resampling, clock)
        write_similarities(output_dir / SIMILARITIES_NAME, sts_data, results.pop("similarities"))
    if cfg.align_uniform_split in sts_data.get("STSBenchmark", {}):
        pairs, embed = sts_data["STSBenchmark"][cfg.align_uniform_split], embeds["STSBenchmark"]
        results["alignment_uniformity"] = {"split": cfg.align_uniform_split, **alignment_uniformity(pairs, embed)}

    if transfer_data:
        results["transfer_mode"] = cfg.mode
        with clock("transfer"):
            results["transfer"] = {
                task: run_transfer_task(task, data, cache, cfg.mode, cfg.jobs, cfg.mrpc_features, resampling)
                for task, data in transfer_data.items()
            }
    if figure_pairs:
        figure = output_dir / "stsb_test_similarity_density.png"
        output_dir.mkdir(parents=True, exist_ok=True)
        cosines = pairwise_cosine(cache(figure_pairs.first), cache(figure_pairs.second))
        counts = similarity_density_figure(cosines, figure_pairs.gold, figure, f"STS-B test: {describe(source)}")
        results["figure"] = {"path": str(figure), "pairs_per_bucket": counts}
    results["timing_s"] = clock.seconds
    finite_record(results, str(output_dir / "results.json"))  # the last guard: never a NaN written as a score
    report = markdown_report(results)
    output_dir.mkdir(parents=True, exist_ok=True)
    # each file whole and never through a link; results.json last: a folder holding it is a finished evaluation
    publish_text(output_dir / "results.md", report + "\n")
    publish_text(output_dir / "results.json", json.dumps(results, indent=2) + "\n")
    print("\n" + report + f"\n(written to {output_dir}/results.json and results.md)")
    log_to_wandb(results, cfg, output_dir)
    return results


def is_file(path: str) -> bool:
    return Path(path).expanduser().is_file()


def run_in_domain_note(checkpoint: str | None) -> str | None:
    """The in-domain caveat of a checkpoint whose run trained on a benchmark's own train split (`in_domain_note`),
    read from the run's `.hydra/config.yaml` beside its checkpoints/ (data.source only, compared as a string, never
    applied); None without that file or for other data."""
    if not checkpoint:
        return None
    config = Path(str(checkpoint)).parent.parent / ".hydra" / "config.yaml"
    if not config.is_file():
        return None
    composed = parse_yaml(config, "Fix: restore the run's .hydra/ files, or move them away")
    data = composed.get("data") if isinstance(composed, dict) else None
    source = data.get("source") if isinstance(data, dict) else None
    return in_domain_note({"source": source}) if isinstance(source, str) else None


def largest_resample(
    sts_data: dict[str, dict[str, SentencePairs]], transfer_data: dict[str, dict[str, Labelled]]
) -> int:
    """The most pairs (an STS task's subsets pooled) or test examples one bootstrap resamples in this evaluation."""
    sizes = pooled_sizes(sts_data)
    sizes += [len(split.labels) for data in transfer_data.values() for split in data.values()]
    return max(sizes, default=0)


def check_whitening_fits(
    encoder: SentenceEncoder | OnnxEncoder, dim: int | None, sts_data: dict[str, dict[str, SentencePairs]]
) -> None:
    """whitening_dim against the size of the embeddings it whitens (the STS tasks'), from one sentence encoded on its
    own: once the encoder is built, before the tasks' sentences are encoded."""
    if dim is None or not sts_data:
        return
    pairs = next(iter(next(iter(sts_data.values())).values()))
    check_dim_fits(dim, embedding_size(encoder, pairs.first[0]))


def score_sts(
    sts_data: dict[str, dict[str, SentencePairs]],
    embed: Embed | Mapping[str, Embed],
    resampling: Resampling,
    clock: Stopwatch,
) -> dict[str, Any]:
    """Each task's scores (`sts`), the table (`sts_table`) with its intervals (`sts_table_intervals`) and the cosines
    (`similarities`, for similarities.npz); `embed` one for every task, or each task's own (a whitening per task)."""
    embeds = embed if isinstance(embed, Mapping) else dict.fromkeys(sts_data, embed)
    with clock("sts_scores"):
        similarities = {task: sts_similarities(subsets, embeds[task]) for task, subsets in sts_data.items()}
        sts = {task: score_similarities(subsets, similarities[task]) for task, subsets in sts_data.items()}
    with clock("intervals"):
        for task, subsets in sts_data.items():
            figures = sts_intervals(task, subsets, similarities[task], sts[task], resampling)
            sts[task]["intervals"] = {figure: interval.as_dict() for figure, interval in figures.items()}
    table = {task: table_score(task, result) for task, result in sts.items()}
    return {
        "sts": sts,
        "sts_table": {task: score for task, score in table.items() if score is not None},
        "sts_table_intervals": {
            task: sts[task]["intervals"][table_figure(task)] for task, score in table.items() if score is not None
        },
        "similarities": similarities,
    }


def describe(source: dict[str, Any]) -> str:
    pooling = part_name(source["pooling"]) or "?"
    name = Path(source.get("checkpoint") or source.get("onnx") or "").name or model_label(source["model"])
    head = part_name(source.get("head"))
    return f"{name}, {pooling}" + (f" + {head}" if head else "")


def flat_metrics(results: dict[str, Any]) -> dict[str, float]:
    """eval/<task> table numbers, eval/<task>/<subset>_spearman, transfer accuracies, alignment/uniformity."""
    metrics = {f"eval/{task}": score for task, score in results.get("sts_table", {}).items()}
    for task, interval in results.get("sts_table_intervals", {}).items():
        metrics |= {f"eval/{task}_ci_low": interval["low"], f"eval/{task}_ci_high": interval["high"]}
    for task, result in results.get("sts", {}).items():
        metrics |= {f"eval/{task}/{name}_spearman": s["spearman"] for name, s in result["subsets"].items()}
    for task, r in results.get("transfer", {}).items():
        metrics |= {f"eval/{task}_acc": r["acc"]}
        metrics |= {f"eval/{task}_acc_ci_low": r["interval"]["low"], f"eval/{task}_acc_ci_high": r["interval"]["high"]}
    au = results.get("alignment_uniformity", {})
    metrics |= {f"eval/{key}": au[key] for key in ("alignment", "uniformity") if key in au}
    return metrics


def log_to_wandb(results: dict[str, Any], cfg: DictConfig, output_dir: Path) -> None:
    """Into the active W&B run, or the one named by wandb_run_id (resumed; offline unless configured online)."""
    import wandb

    run = wandb.run
    if run is None and cfg.get("wandb_run_id"):
        run = wandb.init(
            project=cfg.wandb_project, id=cfg.wandb_run_id, resume="allow", dir=output_dir, mode=wandb_mode()
        )
    if run is None:
        return
    run.summary.update(flat_metrics(results))
    if "figure" in results:
        run.log({"eval/stsb_test_similarity_density": wandb.Image(results["figure"]["path"])})
    if cfg.get("wandb_run_id"):
        run.finish()
