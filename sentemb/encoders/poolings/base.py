"""The pooling interface: what every pooling and head implements, with defaults for all but `forward`.

A pooling keeps no per-batch state: `prepare` returns the backbone's rows together with whatever
a later call needs (the prompt's mask positions, HiCL's segment owners and weights), and every
later call (`forward`, `training_rows`, `training_views`) reads it from that batch.

A new pooling needs `__init__(hidden_size, ...)` and `forward(hidden, batch, train_head)`; the rest
has defaults, grouped by who calls it: training (`training_batch`, `training_rows`,
`training_views`, `prepare_training`), heads (`with_head`; `AroundPooling` for a head that keeps the
pooling's vector) and serving (`graph_refusal`, `serving_rows`, `graph_batch`: format=onnx).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from sentemb.common.errors import SentembConfigError


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
        encoders/serving/onnx_embedder.py): by default the tokenizer's ids as they are."""
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
