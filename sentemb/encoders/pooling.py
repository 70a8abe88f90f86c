"""Poolings: token states (B, L, H) and their prepared batch → sentence embedding (B, H).

A pooling keeps no per-batch state: `prepare` returns the backbone's rows together with whatever
a later call needs (the prompt's mask positions, HiCL's segment owners and weights), and every
later call (`forward`, `training_rows`, `training_views`) reads it from that batch.

`train_head=True` is the training path: CLS pooling then adds SimCSE's MLP (Linear+Tanh),
which evaluation never uses (SimCSE §3: "we take [CLS] without MLP at test time").
`mlp_activation` and `mlp_init_std` give the paradigm paper's code's MLP instead
(isotropy/models.py MLPLayer and custom_param_init: one Linear, Tanh before it for RoBERTa and
none for BERT, weight and bias drawn from N(0, 6e-3)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import ENCODERS, NATIVE, part
from sentemb.encoders.onnx_embedder import prepared_rows
from sentemb.encoders.prompt import (
    PROMPTBERT_TEMPLATE,
    TokenTemplate,
    check_room,
    check_template,
    model_max_length,
    real_ids,
    rebatch,
)


@dataclass
class TrainingViews:
    """The two dropout views' embeddings, the global loss's weight, and auxiliary (weight, loss) terms."""

    z1: torch.Tensor
    z2: torch.Tensor
    global_weight: float = 1.0
    auxiliary: dict[str, tuple[float, torch.Tensor]] = field(default_factory=dict)


class Pooling(nn.Module):
    """What every pooling and head implements; plain poolings keep the defaults.

    Training is split in two so that GradCache can chunk the first part: `training_rows` is per
    row (a row's outputs depend on its own tokens only), `training_views` is the batch-level rest;
    `training_batch` lays out the rows they read (both views, and a head's own rows: MNTP's).
    A head (SARCSE) is a Pooling too; `auxiliary_terms` and `contrastive_weight` are how a pooling
    that aggregates rows (HiCL) asks the pooling of its rows for their per-row losses.
    """

    contrastive_weight: float = 1.0  # the weight of the contrastive loss on this pooling's vectors (SARCSE: α)

    def prepare(self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
        """The backbone's input rows for a tokenised batch (a template, segments), plus what later calls read."""
        return batch

    # why this pooling cannot be one ONNX graph (format=onnx refuses it, naming this), or None
    graph_refusal: str | None = None

    def serving_rows(self, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
        """How an ONNX export lays out a tokenised sentence before its graph, as `prepare` does (the `rows` of
        encoders/onnx_embedder.py): by default the tokenizer's ids as they are."""
        if self.graph_refusal:
            raise SentembConfigError(self.graph_refusal)
        return {"kind": "plain"}

    def graph_batch(
        self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        """What `forward` reads, computed from prepared rows alone (inside an ONNX graph); by default the rows."""
        return batch

    def with_head(self, head: Pooling) -> Pooling:
        """The pooling once a head that makes the sentence vector itself (SARCSE) is added: by default the head.

        A pooling whose own output the head would replace refuses here (`refuse_head`), before any model loads.
        """
        return head

    def training_batch(
        self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        """The backbone's rows of a training step: the batch twice (dropout draws a mask per row: the two views),
        prepared. A head may add rows of its own (MNTP's masked copies)."""
        return self.prepare({name: torch.cat([value, value]) for name, value in batch.items()}, tokenizer)

    def prepare_training(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Whatever training needs once, at fit start (SARCSE: the corpus's token frequencies); nothing by default."""

    def training_rows(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-row training outputs of the prepared rows: here their embeddings, train-only MLP on."""
        return {"embedding": self(hidden, batch, train_head=True)}

    def auxiliary_terms(self, rows: dict[str, torch.Tensor], half: int) -> dict[str, tuple[float, torch.Tensor]]:
        """(weight, loss) terms of the per-row outputs besides the embedding (first `half` rows: view 1); none here."""
        return {}

    def training_views(self, rows: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], n: int) -> TrainingViews:
        """The doubled batch's rows → the two views of its n sentences (first half is view 1); `batch` is the
        prepared doubled batch those rows came from (HiCL reads its segments' owners there)."""
        embedding = rows["embedding"]
        return TrainingViews(embedding[:n], embedding[n:], self.contrastive_weight, self.auxiliary_terms(rows, n))


class AroundPooling(Pooling):
    """A head that keeps its pooling's sentence vector and adds a training term of its own (MNTP): `build_encoder`
    calls `around(pooling)`, and every call goes to the pooling inside unless the head overrides it (typically
    `training_views`, to add an auxiliary (weight, loss) term)."""

    wraps_pooling = True  # build_encoder calls `around(pooling)`: the pooling's vector stays the embedding

    def __init__(self) -> None:
        super().__init__()
        self.inner: Pooling | None = None

    def around(self, pooling: Pooling) -> AroundPooling:
        """This head with `pooling` inside."""
        self.inner = pooling
        return self

    def inner_pooling(self) -> Pooling:
        if self.inner is None:
            raise RuntimeError(f"{type(self).__name__} has no pooling inside: build it with build_encoder (around())")
        return self.inner

    @property
    def contrastive_weight(self) -> float:
        return self.inner_pooling().contrastive_weight

    def prepare(self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
        return self.inner_pooling().prepare(batch, tokenizer)

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        return self.inner_pooling()(hidden, batch, train_head=train_head)

    def prepare_training(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.inner_pooling().prepare_training(tokenizer)

    def training_batch(
        self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        return self.inner_pooling().training_batch(batch, tokenizer)

    def training_rows(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.inner_pooling().training_rows(hidden, batch)

    def training_views(self, rows: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], n: int) -> TrainingViews:
        return self.inner_pooling().training_views(rows, batch, n)


def refuse_head(setting: str) -> NoReturn:
    """A head with a pooling whose output it would silently replace: refused with the fix."""
    raise SentembConfigError(
        f"head=sarcse with {setting}: SARCSE builds the sentence vector itself from the token states, so that "
        "pooling would be ignored. Fix: pooling=cls (SARCSE on the whole sentence) or pooling=hicl "
        "(SARCSE on every segment, pooling.prompt=false)."
    )


MLP_ACTIVATIONS = ("after", "before", "none")


def projection_mlp(hidden_size: int, use: str, activation: str, init_std: float | None) -> nn.Sequential | None:
    """The train-only MLP: Linear then Tanh (SimCSE, `after`), Tanh then Linear (`before`) or Linear alone."""
    if use not in ("train", "always", "none"):
        raise SentembConfigError(f"pooling.mlp={use!r}: use 'train' (SimCSE unsup), 'always' or 'none'")
    if activation not in MLP_ACTIVATIONS:
        raise SentembConfigError(
            f"pooling.mlp_activation={activation!r}: use 'after' (SimCSE: Linear then Tanh), 'before' "
            "(Tanh then Linear) or 'none' (Linear alone)"
        )
    if init_std is not None and not (isinstance(init_std, int | float) and init_std > 0):
        raise SentembConfigError(f"pooling.mlp_init_std={init_std} must be a number > 0, or null for nn.Linear's own")
    if use == "none":
        return None
    linear = nn.Linear(hidden_size, hidden_size)
    if init_std is not None:  # the paradigm code's custom_param_init: N(0, std) for weight and bias
        nn.init.normal_(linear.weight, 0.0, init_std)
        nn.init.normal_(linear.bias, 0.0, init_std)
    layers = {"after": [linear, nn.Tanh()], "before": [nn.Tanh(), linear], "none": [linear]}[activation]
    return nn.Sequential(*layers)


def mlp_linear(mlp: nn.Sequential) -> nn.Linear:
    """The MLP's Linear layer, wherever its activation sits."""
    return next(layer for layer in mlp if isinstance(layer, nn.Linear))


@part(
    "pooling",
    "cls",
    serves=ENCODERS,
    why_not="the first token of a decoder has seen nothing of the sentence",
    export=NATIVE,
)
class CLSPooling(Pooling):
    """[CLS] state; during training passed through SimCSE's MLP (Linear + Tanh, or `mlp_activation`'s form)."""

    def __init__(
        self, hidden_size: int, mlp: str = "train", mlp_activation: str = "after", mlp_init_std: float | None = None
    ) -> None:
        super().__init__()
        self.mlp_use, self.mlp_activation = mlp, mlp_activation
        self.mlp = projection_mlp(hidden_size, mlp, mlp_activation, mlp_init_std)

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        cls = hidden[:, 0]
        if self.mlp is not None and (self.mlp_use == "always" or train_head):
            return self.mlp(cls)
        return cls


@part("pooling", "mean", export=NATIVE)
class MeanPooling(Pooling):
    """Average of the token states the attention mask keeps (padding excluded)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()

    def with_head(self, head: Pooling) -> Pooling:
        refuse_head("pooling=mean")

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)


@part(
    "pooling", "prompt", serves=ENCODERS, why_not="decoders have no [MASK] token (pooling=prompt_eol is their prompt)"
)
class PromptPooling(Pooling):
    """PromptBERT's [MASK] state: each sentence is wrapped in a template, the mask token's hidden state
    is the embedding (plus SimCSE's train-only MLP unless mlp=none).

    The template is applied to token ids inside the encoder's forward (`prepare`), for training and
    for `encode()` alike; the sentence is truncated to fit `max_length` (default: the tokenizer's
    limit), never the template or the mask. Reference: Jiang et al., PromptBERT (EMNLP 2022).
    """

    def __init__(
        self,
        hidden_size: int,
        template: str = PROMPTBERT_TEMPLATE,
        mlp: str = "train",
        max_length: int | None = None,
        mlp_activation: str = "after",
        mlp_init_std: float | None = None,
    ) -> None:
        super().__init__()
        self.template = check_template(template)
        self.max_length = max_length
        self.mlp_use, self.mlp_activation = mlp, mlp_activation
        self.mlp = projection_mlp(hidden_size, mlp, mlp_activation, mlp_init_std)

    def with_head(self, head: Pooling) -> Pooling:
        refuse_head("pooling=prompt")

    def prepare(self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
        """Rewrite a tokenised batch into templated rows (the sentence's own tokens kept, truncated to fit),
        with each row's mask position."""
        rows = prepared_rows(real_ids(batch), self.serving_rows(tokenizer))
        return rebatch(rows, batch, tokenizer.pad_token_id, tokenizer.mask_token_id)

    def serving_rows(self, tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
        """The template at the token level (TokenTemplate): specials stripped, a literal mask token made [UNK], the
        sentence cut to fit; right padding, as `rebatch` pads."""
        template = TokenTemplate.build(tokenizer, self.template)
        limit = self.max_length or model_max_length(tokenizer)
        check_room(template.overhead, limit)
        unk = {} if template.unk_token_id is None else {str(template.mask_token_id): template.unk_token_id}
        pieces = {"start": template.start, "prefix": template.prefix, "suffix": template.suffix, "end": template.end}
        strip = sorted(template.strip_ids)
        return {
            "kind": "template",
            **pieces,
            "strip": strip,
            "replace": unk,
            "max_length": limit,
            "padding_side": "right",
        }

    def graph_batch(
        self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        """The mask position read from the ids (each templated row holds exactly one mask token), as `rebatch`."""
        return {**batch, "mask_position": (batch["input_ids"] == tokenizer.mask_token_id).int().argmax(dim=1)}

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        if "mask_position" not in batch:
            raise RuntimeError(
                "PromptPooling needs the templated batch of its prepare(): call it through SentenceEncoder"
            )
        state = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch["mask_position"]]
        if self.mlp is not None and (self.mlp_use == "always" or train_head):
            return self.mlp(state)
        return state
