"""MNTP: LLM2Vec's masked next-token prediction (BehnamGhader et al. 2024, §2.2) as a head around any decoder pooling.

Masking is llm2vec's (its run_mntp.py with transformers' DataCollatorForLanguageModeling): each real,
non-special token is picked with probability `rate`; of the picked tokens `mask_replace_prob` become
the mask token, `random_replace_prob` a random token of the vocabulary and the rest stay as they were
(80/10/10; the "all_mask" collator of llm2vec's Mistral config is 1.0/0.0). The draws are the
collator's, in its order, from torch's global CPU generator: seeded by the run, restored by checkpoints,
and the same on every device. The loss is the causal-LM loss llm2vec inherits: the state at position
i−1 predicts the original token at picked position i (a picked first token has no predictor and is not
scored), cross-entropy averaged over every scored token of the batch.

The head wraps the pooling (`wraps_pooling`): embeddings, in evaluation and for the contrastive loss,
are the inner pooling's. Training appends one masked copy of each sentence to the batch
(`training_batch`), and each row's output carries its own loss sum and count of scored tokens, so
GradCache's chunks (which cache per-row outputs) give the exact batch mean. `contrastive: false` is
LLM2Vec's first stage: the masked rows alone, MNTP the only objective (`global_weight` 0: no
contrastive loss is computed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedTokenizerBase

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import NON_NEGATIVE, OPEN_UNIT, Bounds, require_number
from sentemb.common.parts import DECODERS, TRAINS_ONLY, part
from sentemb.encoders.poolings.base import AroundPooling, Pooling, TrainingViews

IGNORE = -100  # transformers' label for "not scored"
LABELS = "mntp_labels"  # the prepared batch's key: each row's original token where it is scored, else IGNORE
LOSS_SUM, COUNT = "mntp_loss_sum", "mntp_count"  # per-row outputs: summed cross-entropy and scored tokens
# llm2vec's mask_token_type names (run_mntp.py:673-688) → the token; "mask" adds a token to the vocabulary
MASK_TYPES = {"blank": "_"}


def check_mntp_options(
    mask_token: object, rate: object, weight: object, contrastive: object, mask_replace: object, random_replace: object
) -> None:
    """The head's options, each refused naming its key and the fix (nothing is built)."""

    if not isinstance(mask_token, str) or not mask_token:
        raise SentembConfigError(f"head.mask_token={mask_token!r} must be a token string. Fix: head.mask_token=_")
    if mask_token == "mask":
        raise SentembConfigError(
            "head.mask_token=mask: llm2vec's 'mask' type adds a <mask> token to the vocabulary (new, untrained "
            "embeddings); sentemb uses tokens the model has. Fix: head.mask_token=_ (llm2vec's 'blank', every "
            "published config) or head.mask_token=eos"
        )
    require_number("head.rate", rate, OPEN_UNIT, "head.rate=0.2 (llm2vec; Mistral 0.8)")
    require_number("head.weight", weight, NON_NEGATIVE, "head.weight=1.0")
    if not isinstance(contrastive, bool):
        raise SentembConfigError(
            f"head.contrastive={contrastive!r} must be true or false. Fix: head.contrastive=false (MNTP alone, "
            "LLM2Vec's first stage) or true (beside loss=)"
        )
    if not contrastive and weight == 0:
        raise SentembConfigError(
            "head.weight=0 with head.contrastive=false leaves nothing to train. Fix: head.weight=1.0, or "
            "head.contrastive=true"
        )
    require_number("head.mask_replace_prob", mask_replace, Bounds(0.0, 1.0), "0.8 (llm2vec), 1.0 (its Mistral)")
    require_number(
        "head.random_replace_prob",
        random_replace,
        Bounds(0.0, 1.0 - mask_replace),
        "0.1 with mask_replace_prob 0.8 (llm2vec), 0.0 with 1.0 (its Mistral)",
    )


def mask_token_id(tokenizer: PreTrainedTokenizerBase, mask_token: str) -> int:
    """The id of `mask_token`: "eos" is the tokenizer's EOS, "blank" or "_" the vocabulary's "_" (llm2vec's
    default), anything else a token of the vocabulary; a token the vocabulary lacks is refused."""
    name = type(tokenizer).__name__
    if mask_token == "eos":
        if tokenizer.eos_token_id is None:
            raise SentembConfigError(f"head.mask_token=eos: {name} has no EOS token. Fix: head.mask_token=_")
        return tokenizer.eos_token_id
    token = MASK_TYPES.get(mask_token, mask_token)
    ident = tokenizer.convert_tokens_to_ids(token)
    if ident is None or (ident == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise SentembConfigError(
            f"head.mask_token={mask_token!r}: {token!r} is not a token of {name}'s vocabulary (it would become "
            "<unk>). Fix: head.mask_token=eos, or a token the vocabulary has"
        )
    return ident


def mask_tokens(
    ids: torch.Tensor,
    maskable: torch.Tensor,
    mask_id: int,
    vocab_size: int,
    rate: float,
    mask_replace: float = 0.8,
    random_replace: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(corrupted ids, labels: the original id where picked, IGNORE elsewhere) for CPU tensors.

    transformers' DataCollatorForLanguageModeling.torch_mask_tokens, draw for draw on the global generator
    (llm2vec's collator; `maskable` is its ~special_tokens_mask, padding excluded too).
    """
    labels = ids.clone()
    picked = torch.bernoulli(torch.full(ids.shape, rate).masked_fill(~maskable, 0.0)).bool()
    labels[~picked] = IGNORE
    inputs = ids.clone()
    replaced = torch.bernoulli(torch.full(ids.shape, mask_replace)).bool() & picked
    inputs[replaced] = mask_id
    if mask_replace == 1 or random_replace == 0:
        return inputs, labels
    randomised = torch.bernoulli(torch.full(ids.shape, random_replace / (1 - mask_replace))).bool()
    randomised &= picked & ~replaced
    words = torch.randint(vocab_size, ids.shape, dtype=torch.long)
    inputs[randomised] = words[randomised]
    return inputs, labels


def has_predictor(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) bool: the previous position is a real token of the row (position i−1 predicts token i)."""
    return F.pad(attention_mask.bool()[:, :-1], (1, 0), value=False)


def padded_to(value: torch.Tensor, width: int, fill: int, side: str) -> torch.Tensor:
    """(B, L) → (B, width), the new columns `fill`, on the `side` the tokenizer pads."""
    extra = width - value.shape[1]
    return F.pad(value, (extra, 0) if side == "left" else (0, extra), value=fill)


def joined_rows(parts: list[dict[str, torch.Tensor]], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
    """Prepared row batches stacked in order, each padded to the widest on the tokenizer's padding side."""
    width = max(part["input_ids"].shape[1] for part in parts)
    fills = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0, LABELS: IGNORE}
    return {
        key: torch.cat([padded_to(part[key], width, fill, tokenizer.padding_side) for part in parts])
        for key, fill in fills.items()
    }


@part(
    "head",
    "mntp",
    serves=DECODERS,
    why_not="it predicts next tokens with a decoder's lm_head: it needs a decoder LLM",
    export=TRAINS_ONLY,
)
class MNTPHead(AroundPooling):
    """LLM2Vec's masked next-token prediction around a decoder pooling (module docstring)."""

    term_labels = ("mntp",)

    loads_output_layer = True  # build_encoder loads the causal-LM model and passes its lm_head (`built_with`)

    @classmethod
    def built_with(cls, backbone: nn.Module, output_layer: nn.Module | None) -> dict[str, Any]:
        """The causal-LM model's output layer, MNTP's predictor."""
        return {"lm_head": output_layer}

    def __init__(
        self,
        hidden_size: int,
        special_ids: Sequence[int],
        lm_head: nn.Module | None = None,
        mask_token: str = "_",
        rate: float = 0.2,
        weight: float = 1.0,
        contrastive: bool = True,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
    ) -> None:
        super().__init__()
        check_mntp_options(mask_token, rate, weight, contrastive, mask_replace_prob, random_replace_prob)
        self.mask_token, self.rate, self.weight, self.contrastive = mask_token, rate, weight, contrastive
        self.mask_replace_prob, self.random_replace_prob = mask_replace_prob, random_replace_prob
        self.lm_head = lm_head  # None only where a config is checked without a model (training refuses it)
        # never picked (llm2vec: the collator's special_tokens_mask); not saved: the tokenizer gives them
        self.register_buffer("special_token_ids", torch.tensor(sorted(special_ids), dtype=torch.long), persistent=False)

    def around(self, pooling: Pooling) -> MNTPHead:
        """This head with `pooling` inside: its embeddings are the sentence vectors, in training and evaluation."""
        if not self.contrastive and any(p.requires_grad for p in pooling.parameters()):
            # nothing would train them (and DDP refuses parameters without a gradient)
            raise SentembConfigError(
                f"head.contrastive=false with {type(pooling).__name__}: MNTP alone never trains that pooling's "
                "parameters. Fix: pooling=mean (LLM2Vec's) for the MNTP stage, a trained pooling in the SimCSE stage"
            )
        return super().around(pooling)

    @property
    def contrastive_weight(self) -> float:
        return self.inner_pooling().contrastive_weight if self.contrastive else 0.0

    # evaluation (prepare, forward) is the inner pooling's (AroundPooling)
    def prepare_training(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """The inner pooling's, and the mask token checked against the vocabulary before the first step."""
        self.inner_pooling().prepare_training(tokenizer)
        mask_token_id(tokenizer, self.mask_token)

    # ------------------------------------------------------------------ training
    def masked_rows(
        self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        """One masked copy of each sentence, with the labels MNTP scores (a token whose predictor is padding: none)."""
        ids, mask = batch["input_ids"], batch["attention_mask"]
        maskable = mask.bool() & ~torch.isin(ids, self.special_token_ids)
        inputs, labels = mask_tokens(
            ids.cpu(),
            maskable.cpu(),
            mask_token_id(tokenizer, self.mask_token),
            len(tokenizer),  # llm2vec's collator: random tokens from the whole tokenizer
            self.rate,
            self.mask_replace_prob,
            self.random_replace_prob,
        )
        labels = labels.to(ids.device).masked_fill(~has_predictor(mask), IGNORE)
        return {"input_ids": inputs.to(ids.device), "attention_mask": mask, LABELS: labels}

    def training_batch(
        self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        """The inner pooling's two views (unless `contrastive` is false), then one masked row per sentence."""
        masked = self.masked_rows(batch, tokenizer)
        if not self.contrastive:
            return masked
        views = self.inner_pooling().training_batch(batch, tokenizer)
        extra = sorted(set(views) - {"input_ids", "attention_mask"})
        if extra:
            raise RuntimeError(f"head=mntp cannot append rows to {type(self.inner).__name__}'s batch (it has {extra})")
        views = {**views, LABELS: torch.full_like(views["input_ids"], IGNORE)}
        return joined_rows([views, masked], tokenizer)

    def training_rows(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The inner pooling's per-row outputs, and each row's MNTP loss sum and scored-token count."""
        rows = self.inner_pooling().training_rows(hidden, batch) if self.contrastive else {}
        total, count = self.prediction_losses(hidden, batch[LABELS])
        return {**rows, LOSS_SUM: total, COUNT: count}

    def prediction_losses(self, hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B,) summed cross-entropy of each row's scored tokens, each predicted from the state before it, and (B,)
        their number; the vocabulary's logits are computed at those positions only."""
        if self.lm_head is None:
            raise RuntimeError("MNTPHead has no lm_head: build it with build_encoder (it loads the causal-LM model)")
        rows, before = (labels[:, 1:] != IGNORE).nonzero(as_tuple=True)
        logits = self.lm_head(hidden[rows, before]).float()  # llm2vec's causal-LM loss upcasts its logits too
        losses = F.cross_entropy(logits, labels[rows, before + 1], reduction="none")
        total = losses.new_zeros(labels.shape[0]).index_add(0, rows, losses)
        return total, torch.bincount(rows, minlength=labels.shape[0]).float()

    def training_views(self, rows: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], n: int) -> TrainingViews:
        """The inner pooling's views of the first rows, and ("mntp", (weight, mean over the batch's scored tokens))."""
        # the count is no function of the weights: detached, so GradCache replays the sums alone
        loss = rows[LOSS_SUM].sum() / rows[COUNT].detach().sum().clamp_min(1)
        term = {"mntp": (self.weight, loss)}
        if not self.contrastive:  # LLM2Vec's first stage: no views, no contrastive loss
            empty = loss.new_zeros(0, 0)
            return TrainingViews([empty, empty], global_weight=0.0, own_terms=term)
        first = batch["input_ids"].shape[0] - n  # the inner pooling's rows precede the masked ones
        inner_rows = {key: value[:first] for key, value in rows.items() if key not in (LOSS_SUM, COUNT)}
        inner_batch = {key: value[:first] for key, value in batch.items() if key != LABELS}
        views = self.inner_pooling().training_views(inner_rows, inner_batch, n)
        return replace(views, own_terms={**views.own_terms, **term})
