"""The pre-run checks: every part's own check, cheapest first, before any model loads.

Each check lives beside the code it guards (the loss's and pooling's constructors, the pooling's
`with_head`, the backbone's `check_model`, GradCache's `check_grad_cache`, the Trainer's `check_devices`, ...);
this only calls them in order. The options that name no part and the data files are checked first, before torch,
lightning and transformers are imported (their modules' torch-free checks: `*_checks.py` beside them), so a config
or data error is answered in about a second; the checks that build toy parts (a loss's constructor refusing
loss.tau=0, a pooling's, a head's), look up the parts registry (whose modules define torch classes), ask torch for
devices or the hub for a model come after, importing torch where they are called.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sentemb.common.batch_views import ANCHOR, POSITIVE
from sentemb.common.config_fields import check_fields
from sentemb.common.errors import SentembConfigError
from sentemb.common.hydra_plumbing import resolved_container
from sentemb.common.metric_names import check_metric_name
from sentemb.common.parts import declared_part
from sentemb.common.paths import absolute_data_paths, resolve_data_root
from sentemb.data.corpus import HEAD_LINES, CorpusReport, check_corpus
from sentemb.data.datamodule_checks import check_batching, check_corpus_fills_batch, check_labelled_options
from sentemb.data.labelled import LabelledSet, read_labelled, scored_sets
from sentemb.data.repetition import check_dup_rate
from sentemb.data.streaming_checks import check_streaming
from sentemb.training.callback_checks import check_eval_settings
from sentemb.training.sharding_checks import devices_asked
from sentemb.training.trainer_checks import check_trainer_sizes

MAX_SEED = 2**32 - 1  # numpy's (Lightning's seed_everything seeds it too)
TOY_SIZE = 8  # poolings and heads are built at this width to run their constructors' checks in milliseconds


def prepare_run(cfg: DictConfig) -> CorpusReport | LabelledSet:
    """Validate the config and the data it names, cheapest first; nothing here loads a model.

    Fills in `paths.data_dir` with the data root actually found, so the logged config says
    where the data came from.
    """
    check_options(cfg)  # torch-free, as is `read_data`: answered before torch and lightning are imported
    # a run resumed from ckpt_path: its checkpoint checked against this config (with torch) before the corpus is read
    data = None if cfg.get("ckpt_path") else read_data(cfg)
    check_built_parts(cfg)  # the parts' own constructors (torch's modules) from here on
    from sentemb.encoders.build import check_length_fits
    from sentemb.encoders.models.backbones import check_model
    from sentemb.training.checkpoints import check_checkpoint_path
    from sentemb.training.negatives.base import check_resumed_negatives
    from sentemb.training.trainer import check_devices

    check_devices(cfg.trainer)  # trainer=gpu without a GPU: here, not after the model loaded
    check_model(cfg.model)  # an unreachable hub fails here, in seconds
    # a long sentence past the position embeddings would stop training with an IndexError at some later step
    check_length_fits(resolved_container(cfg.model), cfg.data.get("max_length"))
    resumed = check_checkpoint_path(cfg.get("ckpt_path"), cfg)  # whole, a sentemb checkpoint, of this model
    # of this negatives part, its state (ESimCSE's queue) sound: the file as just read, not read and CRC-checked again
    check_resumed_negatives(cfg.get("ckpt_path"), cfg, resumed)
    from sentemb.training.teacher import check_resumed_teacher, check_teacher

    check_teacher(cfg)  # a loss reading a teacher has one, and its source is there (no model loads)
    check_resumed_teacher(cfg, resumed)  # a resumed run's teacher is the checkpoint's
    if data is None:
        data = read_data(cfg)
    if isinstance(data, LabelledSet):  # the rows against the loss and step parts (the registry's: torch)
        check_labelled_fit(cfg, data, whole=read_whole(cfg, data))
    else:
        refuse_scored_loss(cfg.loss, "data.corpus: one sentence per line has no scores")
        refuse_hard_negative_settings(
            resolved_container(cfg.loss), f"data.corpus={cfg.data.corpus}: one sentence per line"
        )
    check_auxiliary_views(cfg, data)
    from sentemb.training.teacher import check_teacher_data

    check_teacher_data(cfg, data.roles if isinstance(data, LabelledSet) else [ANCHOR, POSITIVE])
    return data


def check_auxiliary_views(cfg: DictConfig, data: CorpusReport | LabelledSet) -> None:
    """Each auxiliary term's `reads` against the views the data makes (the anchor, the positive, a labelled set's
    columns, the views the terms ask an unlabelled corpus to make), before any model loads."""
    from sentemb.encoders.part_configs import build_part
    from sentemb.training.auxiliary_checks import auxiliary_nodes, check_term_views

    terms = [build_part("auxiliary", node) for node in auxiliary_nodes(resolved_container(cfg.get("auxiliary")))]
    if not terms:
        return
    if isinstance(data, LabelledSet):
        made, named = data.roles, f"{data.source} (data.source={cfg.data.source})"
    else:
        asked = [role for term in terms for role in term.data_views()]
        made, named = [ANCHOR, POSITIVE, *dict.fromkeys(asked)], f"data.corpus={cfg.data.corpus}"
    check_term_views([(declared_part(term).name, term.reads) for term in terms], made, named)


def read_data(cfg: DictConfig) -> CorpusReport | LabelledSet:
    """The data `cfg.data` names, read and checked against the batch (torch-free); sets `paths.data_dir`."""
    cfg.paths.data_dir = str(resolve_data_root(cfg.paths.data_dir))
    absolute_data_paths(cfg.data)
    if is_labelled(cfg.data):  # every row read and checked here, before any model loads
        data = resolved_container(cfg.data)
        check_labelled_options(
            bool(data.get("streaming")), {}, data.get("dup_rate", 0.0), data.get("source"), data.get("columns"),
            data.get("score_range"),
        )  # fmt: skip
        # streamed: the head here (at least one batch a device, so a file shorter than that is known to be), every
        # other row as the stream reads it (file and line named there)
        labelled = read_labelled(data, head_rows(cfg))
        check_labelled_batch(cfg, labelled, whole=read_whole(cfg, labelled))
        return labelled
    report = check_corpus(Path(cfg.data.corpus).expanduser(), streaming=bool(cfg.data.get("streaming")))
    check_corpus_fills_batch(report, cfg.data.get("batch_size"), processes(cfg.trainer))
    return report


def head_rows(cfg: DictConfig) -> int | None:
    """The rows of a streamed labelled file read before the run: HEAD_LINES, or one batch a device when larger
    (None: not streamed, every row is read)."""
    if not cfg.data.get("streaming"):
        return None
    return max(HEAD_LINES, (cfg.data.get("batch_size") or 0) * processes(cfg.trainer))


def read_whole(cfg: DictConfig, labelled: LabelledSet) -> bool:
    """Whether `labelled` holds every row of its file: not streamed, or a streamed file shorter than its head."""
    head = head_rows(cfg)
    return head is None or len(labelled) < head


def is_labelled(data: Mapping[str, Any]) -> bool:
    """Labelled rows (conf/data/labelled.yaml and the built-in sets), not one sentence per line."""
    return "source" in data


def refuse_scored_loss(loss: Mapping[str, Any], why: str) -> None:
    """A loss that reads scores (its `reads`) on data without scores (`why`)."""
    from sentemb.losses.registry import declared_loss

    if declared_loss(loss).scores_refusal(loss, scored=False):
        built_in = "".join(f"data={name}, or " for name in scored_sets())
        raise SentembConfigError(
            f"loss={loss.get('name')} learns from scored pairs, but {why}. Fix: scored pairs ({built_in}"
            "data=labelled with a sentence1,sentence2,score file and data.score_range), or a loss of pairs and "
            "negatives (loss=infonce)"
        )


def check_labelled_fit(cfg: DictConfig, labelled: LabelledSet, whole: bool = True) -> None:
    """The labelled rows against the run: one whole batch per device (`whole`: all rows were read, not a streamed
    file's head), a loss for their kind (scored pairs: a scored pair's loss; hard negatives: a loss with a negatives'
    denominator), no view they cannot make, no setting they leave unused (data.score_range without scores,
    loss.hard_negative_weight without hard negatives), and rows the loss can learn from (`check_learnable`)."""
    from sentemb.encoders.part_configs import build_part
    from sentemb.losses.inputs import SCORES
    from sentemb.losses.registry import available, declared_loss, negatives_losses
    from sentemb.training.auxiliary_checks import auxiliary_nodes
    from sentemb.training.learnable import check_learnable

    check_labelled_batch(cfg, labelled, whole)
    loss = resolved_container(cfg.loss)
    declared = declared_loss(loss)  # what the loss reads and takes, declared on its class
    if labelled.scores is not None and declared.scores_refusal(loss, scored=True):
        scored = ", ".join(name for name in available() if declared_loss({"name": name}).reads >= {SCORES})
        raise SentembConfigError(
            f"{labelled.source} holds scored pairs: {declared.scores_refusal(loss, scored=True)}. Fix: a scored "
            f"loss ({scored}), or a file of (anchor, positive) pairs"
        )
    if labelled.scores is None:
        refuse_scored_loss(loss, f"{labelled.source} holds no scores ({', '.join(labelled.roles)})")
        refuse_unscored_range(cfg.data.get("score_range"), labelled)
    if not labelled.hard_negatives:
        refuse_hard_negative_settings(loss, f"{labelled.source} ({', '.join(labelled.roles)})")
    else:
        refusal = declared.hard_negatives_refusal(loss)
        if refusal:
            raise SentembConfigError(
                f"{labelled.source} has hard negatives: {refusal} Fix: a loss with a negatives' denominator "
                f"({', '.join(negatives_losses())}), or data.columns naming only the anchor and positive columns"
            )
    asked = {}
    for node in auxiliary_nodes(resolved_container(cfg.get("auxiliary"))):
        asked.update(build_part("auxiliary", node).data_views())
    data = resolved_container(cfg.data)
    check_labelled_options(
        bool(data.get("streaming")), asked, data.get("dup_rate", 0.0), data.get("source"), data.get("columns"),
        data.get("score_range"),
    )  # fmt: skip
    if whole:  # last: it reads every row; a streamed file's head alone may lack what its later rows hold (sorted)
        check_learnable(loss, labelled, extra_negatives=bool(cfg.get("negatives")))


def refuse_unscored_range(score_range: Any, labelled: LabelledSet) -> None:
    """data.score_range scales a score column: set on rows without one it would be ignored."""
    if score_range is not None:
        raise SentembConfigError(
            f"data.score_range={list(score_range)} is set, but {labelled.source} holds no score column (its views: "
            f"{', '.join(labelled.roles)}), so nothing would read it. Fix: data.score_range=null, or a file with a "
            "score column named score or label"
        )


def refuse_hard_negative_settings(loss: Mapping[str, Any], data: str) -> None:
    """A loss setting that acts on labelled hard negatives only (InfoNCE's hard_negative_weight), set on data that has
    none (`data`: what it is), would change nothing."""
    from sentemb.losses.registry import hard_negative_settings

    settings = hard_negative_settings(loss)
    if settings:
        unset = " ".join(f"{setting.split('=')[0]}=0" for setting in settings)
        raise SentembConfigError(
            f"{', '.join(settings)} weighs labelled hard negatives, but {data} has none, so it would change nothing. "
            f"Fix: {unset}, or data with a hard-negative column (anchor,positive,negative)"
        )


def check_labelled_batch(cfg: DictConfig, labelled: LabelledSet, whole: bool = True) -> None:
    """One whole batch of labelled rows per device (`whole`: all rows were read, not a streamed file's head)."""
    batch_size, world = cfg.data.get("batch_size"), processes(cfg.trainer)
    if whole and batch_size is not None and len(labelled) < batch_size * world:
        devices = f" on each of {world} devices" if world > 1 else ""
        # a stream drops a partial batch: it would end before its first step, without a checkpoint
        streamed = (
            ", so the stream (data.streaming=true) has no whole batch to train on" if cfg.data.get("streaming") else ""
        )
        raise SentembConfigError(
            f"{labelled.source}: {len(labelled)} labelled rows, fewer than one batch of data.batch_size={batch_size}"
            f"{devices}{streamed}. Fix: a smaller data.batch_size, or more rows"
        )


def processes(trainer: Mapping[str, Any]) -> int:
    """The data-parallel processes a trainer config asks for, each with its own data.batch_size; 1 where only
    Lightning knows (trainer.devices=auto or -1): a lower bound, so no corpus is refused that might suffice."""
    return max(devices_asked(trainer.get("devices")), 1) * int(trainer.get("num_nodes") or 1)


def check_seed(value: Any, key: str = "seed") -> None:
    """A seed is a whole number numpy takes (0 to 2**32 - 1); Lightning's seed_everything would raise a bare
    ValueError naming no key (seed=abc), or pick 0 for one out of bounds."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEED:
        return
    raise SentembConfigError(
        f"{key}={value!r} is not a seed: it must be a whole number from 0 to {MAX_SEED}. Fix: e.g. {key}=42"
    )


def check_parts(cfg: DictConfig) -> None:
    """The checks that read no file and no network: the loss, pooling and head options, batching, GradCache, eval."""
    check_options(cfg)
    check_built_parts(cfg)


def check_options(cfg: DictConfig) -> None:
    """The options that name no part (batching, seeds, streaming, eval, the optimized metric): torch-free."""
    # every size before anything uses one: `data.batch_size=abc` is named here, not met by a comparison's TypeError
    check_batching(cfg.data.get("batch_size"), cfg.data.get("max_length"), cfg.data.get("num_workers"))
    check_trainer_sizes(cfg.trainer)
    check_eval_settings(
        cfg.eval.get("every_n_steps", 125), cfg.eval.get("batch_size", 128), cfg.eval.get("at_start", True)
    )
    check_dup_rate(cfg.data.get("dup_rate", 0.0))
    check_seed(cfg.get("seed"))
    if "seed" in cfg.data:  # the shuffle's own generator: ${seed} unless set apart
        check_seed(cfg.data.seed, "data.seed")
    check_streaming(cfg.data, cfg.trainer)
    if cfg.get("optimized_metric"):  # a typo would otherwise surface only when the job ends
        check_metric_name(cfg.optimized_metric)


def check_built_parts(cfg: DictConfig) -> None:
    """The parts built from their configs (toys: the loss, pooling and head constructors' own checks), GradCache,
    sharding, the step parts and the schedule: these import torch (the parts' modules define torch classes)."""
    from sentemb.encoders.part_configs import EncoderConfig, checked_part

    if not cfg.get("loss"):
        raise SentembConfigError("loss: no objective configured. Fix: pick one, e.g. loss=infonce")
    choices = OmegaConf.select(cfg, "hydra.runtime.choices") or {}
    loss = checked_part("loss", cfg.loss)
    # a stray field (a sweep's loss.m on InfoNCE) named before the constructor's TypeError
    check_fields(cfg.loss, "loss", loss.entry.build, choices.get("loss"))
    loss.build()  # each objective validates its own hyper-parameters (e.g. τ > 0); torch alone is imported so far
    for group in ("pooling", "head"):  # their packages import transformers
        if cfg.get(group):
            check_fields(cfg[group], group, checked_part(group, cfg[group]).entry.build, choices.get(group))
    from sentemb.data.datamodule import check_data_fields
    from sentemb.encoders.build import attach_head  # lightning and transformers: after the loss's own checks
    from sentemb.encoders.models.decoders import warn_without_dropout
    from sentemb.training.grad_cache import check_grad_cache
    from sentemb.training.learnable import check_loss_width
    from sentemb.training.module import check_warmup_ratio
    from sentemb.training.sharding import check_sharding

    # every part registered with plain options, the pooling and head fit the backbone, adapter and model options
    parts = EncoderConfig.checked(cfg.model, cfg.pooling, cfg.get("head"), cfg.get("adapter"))
    heads = parts.pooling.options.get("num_heads")  # the latent pooling's heads must divide the width: a toy width
    toy = TOY_SIZE * heads if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0 else TOY_SIZE
    pooling, head = parts.pooling.build(hidden_size=toy), None  # template, MLP options
    if parts.head is not None:  # the head's own options, then whether the pooling accepts it
        head = parts.head.build(hidden_size=toy, special_ids=[])
        attach_head(pooling, head)
        head.check_sources()  # a model the head loads at fit start is there
    # a width the loss cannot take (AnglE: odd, SARCSE's 1497) would fail at the first step
    check_loss_width(resolved_container(cfg.loss), resolved_container(cfg.model), head, getattr(parts.head, "name", ""))
    if parts.model.decoder and (parts.head is None or parts.head.options.get("contrastive", True)):
        warn_without_dropout(parts.model.raw)  # MNTP alone trains without dropout on purpose
    check_grad_cache(cfg.get("grad_cache"), cfg.data.batch_size)
    check_matryoshka(resolved_container(cfg.get("matryoshka")), resolved_container(cfg.model), head)
    check_eval_truncation(cfg, head)
    check_data_fields(cfg.data, is_labelled(cfg.data), choices.get("data"))  # a key the datamodule would not take
    check_sharding(cfg)  # trainer=fsdp: several processes, a precision FSDP2 takes
    named = f"pooling={parts.pooling.name}" + (f" with head={parts.head.name}" if parts.head is not None else "")
    check_step_parts(cfg, pooling.own_term_labels(), named)
    check_warmup_ratio(resolved_container(cfg.get("scheduler")))


def check_matryoshka(matryoshka: Mapping[str, Any] | None, model: Mapping[str, Any], head: Any = None) -> None:
    """matryoshka.dims and .weights, the largest size within the sentence vector's width where it is known before the
    model loads (a head's own output_size, else the backbone's declared hidden size)."""
    if not matryoshka or matryoshka.get("dims") is None:
        return
    from sentemb.eval.truncation import sentence_width
    from sentemb.losses.matryoshka import check_dims

    check_dims(matryoshka["dims"], matryoshka.get("weights"), sentence_width(model, head))


def check_eval_truncation(cfg: DictConfig, head: Any = None) -> None:
    """eval.truncate_dim: null, or a size of at least 1 within the sentence vector's width (as matryoshka.dims);
    a size matryoshka.dims does not train is warned about."""
    size = OmegaConf.select(cfg, "eval.truncate_dim", default=None)
    if size is None:
        return
    from sentemb.eval.truncation import check_truncate_dim, sentence_width

    dims = OmegaConf.select(cfg, "matryoshka.dims", default=None)
    trained = [int(d) for d in dims] if dims else None
    check_truncate_dim(size, "eval.truncate_dim", sentence_width(resolved_container(cfg.model), head), trained)


# the part kinds a step adds to the encoder and loss (training/module.py), each with the base its parts subclass
# (by dotted path: both are torch modules, imported when a step part is checked)
STEP_PARTS = {
    "negatives": "sentemb.training.negatives.NegativesPart",
    "auxiliary": "sentemb.training.auxiliary.AuxiliaryTerm",
}


def check_step_parts(cfg: DictConfig, own_labels: set[str] | None = None, parts_named: str = "the pooling") -> None:
    """Each configured step part built from its config (its constructor checks its options; nothing is copied or
    loaded until the module tracks the encoder), then its own `check_config` against the run's parts: the loss, the
    pooling, the adapter and model, the trainer's strategy and devices (its other fields interpolate Hydra's run
    folder, unset in a sweep's check) and the data config; the auxiliary terms' labels against each other's and the
    pooling's and head's own terms' (`own_labels`, of `parts_named`)."""
    from hydra.utils import get_class

    from sentemb.encoders.part_configs import build_part
    from sentemb.training.auxiliary_checks import auxiliary_nodes, check_term_labels

    parts = {key: resolved_container(cfg.get(key)) for key in (*STEP_PARTS, "loss", "pooling", "adapter", "model")}
    trainer = {key: resolved_container(cfg.trainer.get(key)) for key in ("strategy", "devices")}
    run = {**parts, "trainer": trainer, "data": resolved_container(cfg.data)}
    nodes = {
        "negatives": [parts["negatives"]] if parts["negatives"] else [],
        "auxiliary": auxiliary_nodes(parts["auxiliary"]),
    }
    built_terms = []
    for kind, path in STEP_PARTS.items():
        base = get_class(path)
        for node in nodes[kind]:
            built = build_part(kind, node)
            if not isinstance(built, base):
                raise SentembConfigError(
                    f"{kind}={node.get('name')}: {type(built).__name__} is not a {base.__name__}, the base "
                    f"every {kind} part subclasses (docs/layout.md: adding a part). Fix: subclass "
                    f"{base.__module__}.{base.__name__}"
                )
            built.check_config(run)
            if kind == "auxiliary":
                built_terms.append((node.get("name"), built.label))
    check_term_labels(built_terms, own_labels or set(), parts_named)
