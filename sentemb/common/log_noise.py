"""The library log lines and warnings a sentemb run does not need, silenced in this one place, each with its reason.

Everything else a library prints is left alone: a line that is not listed here may matter. The
commands install these filters when they start (sentemb.common.process.configure_process).
"""

from __future__ import annotations

import logging
import warnings

# Python warnings (a regex of the message) → why a sentemb user need not act on them
WARNINGS = {
    r".*could not find the monitored key.*": "ModelCheckpoint checks its monitor every step; the dev metric exists "
    "from the first dev evaluation on, by design",
    r".*does not have many workers.*": "the train set is tokenised up front: worker processes would not speed up "
    "building batches of tokenised rows",
    r"Checkpoint directory .* exists and is not empty.*": "a resumed run writes into its own checkpoint folder (its "
    "W&B run id lives there) on purpose; a fresh start sets an old run's checkpoints aside first (rerun_policy.py)",
    r".*'set_vital' is deprecated.*": "torchdata's StatefulDataLoader (the train set's loader) calls a torch API "
    "that torch now marks deprecated: nothing a user can change",
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*": "Lightning 2.6 calls torch's pytree API in a form torch "
    "2.13 deprecates: nothing a user can change",
    r".*`is_gradient_checkpointing` is deprecated.*": "peft 0.21 reads transformers' old property name when it wraps "
    "or saves a model (adapter=lora): nothing a user can change",
    r"FSDP2-wrapped module \(FSDPSentenceEncoder\) returned a view tensor.*": "trainer=fsdp: SARCSE's embedding is a "
    "reshaped view; sentemb changes no training output in place, and the sharded gradients equal one process's "
    "(tests/test_fsdp.py)",
    r"Found \d+ module\(s\) in eval mode at the start of training.*": "negatives=momentum: the momentum encoder runs "
    "in eval mode on purpose (ESimCSE encodes its queue without dropout); SentembModule puts every other module in "
    "train mode itself",
    r".*The axis name: \w+ will not be used, since it shares the same shape constraints.*": "format=onnx names the "
    "batch and sequence axes of every graph input alike; torch's exporter keeps one name per axis, as wanted",
}

# loggers whose lines below a level are dropped → (that level, why)
QUIET_LOGGERS = {
    "onnx_ir": (logging.WARNING, "format=onnx: the ONNX IR's optimisation passes log each initializer they merge"),
    "onnxscript": (logging.WARNING, "format=onnx: onnxscript's rewriter logs each rule and constant it folds"),
    "torch.onnx._internal.exporter._registration": (
        logging.ERROR,
        "format=onnx: torch's exporter warns that torchvision's operators are not registered; sentemb has none",
    ),
}

# Lightning's info lines (the start of the message) → why they are dropped
LIGHTNING_LINES = {
    "💡 Tip:": "an advertisement for Lightning's cloud logger",
    "Loading `train_dataloader` to estimate number of stepping batches": "the scheduler's length, computed every run",
}

# lines libraries log through the root logger (the start of the message) → why they are dropped
ROOT_LINES = {
    "Quantization parameters for tensor": "ONNX Runtime's dynamic quantisation (export.quantize=int8) computes "
    "activation scales at run time by design; it logs one line per tensor it therefore leaves without them",
    "Ignore MatMul due to non constant B": "attention's activation x activation products, which export.quantize=int8 "
    "keeps in float on purpose (MatMulConstBOnly)",
    "Please consider to run pre-processing before quantization": "ONNX Runtime's advice for static quantisation "
    "with calibration data; export.quantize=int8 is dynamic and measured against fp32 in the model card",
}


class DropLines(logging.Filter):
    """Drops the records whose message starts with one of `starts`."""

    def __init__(self, starts: list[str]) -> None:
        super().__init__()
        self.starts = tuple(starts)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


class DropPoolerOnlyReport(logging.Filter):
    """transformers' LOAD REPORT when its only rows are the BERT/RoBERTa pooler weights sentemb leaves out on purpose
    (add_pooling_layer=False: SimCSE never uses the NSP pooler); any other row keeps the whole report."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "LOAD REPORT" not in message:
            return True
        rows = [line.split("|") for line in message.splitlines()[2:] if line.count("|") >= 2]
        return not rows or not all(r[0].strip().startswith("pooler.") and "UNEXPECTED" in r[1] for r in rows)


def silence_known_noise() -> None:
    """Install the filters above (a second call adds nothing)."""
    for pattern in WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropLines) for f in logger.filters):
            logger.addFilter(DropLines(list(LIGHTNING_LINES)))
    for name, (level, _) in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    root = logging.getLogger()
    if not any(isinstance(f, DropLines) for f in root.filters):
        root.addFilter(DropLines(list(ROOT_LINES)))
    loading = logging.getLogger("transformers.modeling_utils")
    if not any(isinstance(f, DropPoolerOnlyReport) for f in loading.filters):
        loading.addFilter(DropPoolerOnlyReport())
