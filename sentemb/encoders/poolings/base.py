"""The pooling interface: a `Pooling` implements `__init__(hidden_size, ...)` and `forward`, optionally `prepare`.

Everything else a pooling or head can answer is a hook with a default, in one small mixin per caller:
- `TrainingHooks`: training (the encoder, the LightningModule and GradCache call them);
- `HeadHooks`: how a pooling accepts or refuses a head (`build_encoder` calls them);
- `ServingHooks`: format=onnx alone reads them (encoders/serving/).
A plain pooling (CLS, mean) keeps every default. `AroundPooling` is the base of a head that keeps its pooling's
sentence vector (MNTP).

A pooling keeps no per-batch state: `prepare` returns the backbone's rows together with whatever
a later call needs (the prompt's mask positions, HiCL's segment owners and weights), and every
later call (`forward`, `training_rows`, `training_views`) reads it from that batch.

The mixins define no `__init__` and no class attribute that could shadow a submodule (nn.Module keeps
submodules in `_modules`, found only when normal attribute lookup fails): their class attributes are plain
values (`contrastive_weight`, `graph_refusal`) that a subclass overrides at class level or with a property.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from sentemb.common.batch_views import has_views, stacked_views, training_view_batches
from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import declared_part


@dataclass
class TrainingViews:
    """Every view's embeddings in the batch's order (`embeddings`: the anchor's, its positive's, then the others'),
    the global loss's weight, the pooling's and head's own (weight, loss) terms (`own_terms`: HiCL's local loss,
    SARCSE's reconstruction; the `auxiliary=` parts' terms are the module's), each view's role (`roles`, filled from the
    batch: sentemb.common.batch_views) by which a part reads a view (`view`), and for a view some rows lack (a built-in
    set's missing hard negative) the rows that have it (`present`: role → (N,) bool)."""

    embeddings: list[torch.Tensor]
    global_weight: float = 1.0
    own_terms: dict[str, tuple[float, torch.Tensor]] = field(default_factory=dict)
    roles: tuple[str, ...] = ()
    present: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def z1(self) -> torch.Tensor:
        """The anchor's embeddings (view 1)."""
        return self.embeddings[0]

    @property
    def z2(self) -> torch.Tensor:
        """The positive's embeddings (view 2)."""
        return self.embeddings[1]

    def named(self, roles: list[str]) -> TrainingViews:
        """These views with their roles, one per view (the batch's `view_roles`)."""
        if len(roles) != len(self.embeddings):
            raise RuntimeError(f"{len(self.embeddings)} training views for the batch's {len(roles)} roles {roles}")
        return replace(self, roles=tuple(roles))

    def rows_with(self, roles: tuple[str, ...]) -> tuple[TrainingViews, int | None]:
        """These views cut to the rows that have every view in `roles` (`present`), and how many rows are left (None:
        every row has them, nothing was cut): what a part reading those views sees, never an absent one."""
        masks = [self.present[role] for role in roles if role in self.present]
        if not masks:
            return self, None
        keep = masks[0] if len(masks) == 1 else torch.stack(masks).all(dim=0)
        kept = replace(self, embeddings=[embedding[keep] for embedding in self.embeddings], present={})
        return kept, int(keep.sum())

    def view(self, role: str, asked_by: str) -> torch.Tensor:
        """The embeddings of the view called `role`, which `asked_by` reads; refused when the batch has none."""
        if role not in self.roles:
            raise RuntimeError(
                f"{asked_by} reads the training view {role!r}, which the batch does not carry (its views: "
                f"{', '.join(self.roles)}): build the data with sentemb.data's datamodule, which makes the views the "
                "configured parts ask for"
            )
        return self.embeddings[self.roles.index(role)]


def split_views(embedding: torch.Tensor, n: int) -> list[torch.Tensor]:
    """The rows of n sentences' views, view after view (n rows each: anchor, positive, then any others)."""
    return list(embedding.split(n))


class TrainingHooks:
    """How a pooling trains; the defaults are unsupervised SimCSE's (the batch twice, one embedding per row).

    Who calls them: the LightningModule (training/module.py) calls `prepare_training` once at fit start and,
    through the encoder (encoders/encoder.py), `training_batch` → `training_rows` → `training_views` each step;
    HiCL calls its segment pooling's `own_terms` and `contrastive_weight` (a head on every segment).

    Training is split in two so that GradCache (training/grad_cache.py) can chunk the first part:
    `training_rows` is per row (a row's outputs depend on its own tokens only), so GradCache runs it on
    chunks of rows, caches the outputs and replays each chunk's backward; `training_views` is the
    batch-level rest (the pairing of views, HiCL's aggregation and local loss), run once on the whole
    batch of cached rows. A hook that needs other rows belongs in `training_views`, never in `training_rows`.

    The defaults call the `prepare` and `forward` of the Pooling they are part of.
    """

    # the labels of the (weight, loss) terms `own_terms` / `training_views` add (logged as train/loss/<label>)
    term_labels: tuple[str, ...] = ()
    # the weight of the contrastive loss on this pooling's vectors: 1 (plain SimCSE); SARCSE's α, MNTP's 0 without
    # contrastive training (both properties); HiCL multiplies its global weight by its segment pooling's
    contrastive_weight: float = 1.0

    def training_batch(
        self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        """The backbone's rows of a training step, prepared: the batch twice (dropout draws a mask per row: the two
        views), or the batch's own views, in order (a repeated copy or labelled positive as view 2, any others after
        it; see sentemb.common.batch_views). Called by `SentenceEncoder.training_batch`; a head may add rows of its own
        (MNTP's masked copies)."""
        if not has_views(batch):  # unsupervised SimCSE: the same rows twice
            return self.prepare({name: torch.cat([value, value]) for name, value in batch.items()}, tokenizer)
        rows = stacked_views(training_view_batches(batch), tokenizer.pad_token_id, tokenizer.padding_side)
        return self.prepare(rows, tokenizer)

    def prepare_training(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """Whatever training needs once, at fit start (the LightningModule's `on_fit_start`; SARCSE: the corpus's
        token frequencies). Nothing by default: a pooling that only reads its batch needs nothing more."""

    def training_rows(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-row training outputs of prepared rows (any subset of them: GradCache passes chunks), each a tensor
        whose first dimension is the rows: by default their embeddings, train-only MLP on (`train_head=True`)."""
        return {"embedding": self(hidden, batch, train_head=True)}

    def own_term_labels(self) -> set[str]:
        """The labels of every term this pooling adds, with those of the parts inside it (`term_labels`)."""
        return set(self.term_labels)

    def own_terms(self, rows: dict[str, torch.Tensor], half: int) -> dict[str, tuple[float, torch.Tensor]]:
        """(weight, loss) terms of the per-row outputs besides the embedding (first `half` rows: view 1), read by
        `training_views` here and by HiCL for its segment pooling (SARCSE's reconstruction); none by default."""
        return {}

    def training_views(self, rows: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], n: int) -> TrainingViews:
        """The training rows → the views of its n sentences (first n rows: view 1; then view 2; then any other view
        the batch carries, n rows each); `batch` is the prepared batch those rows came from (HiCL reads its segments'
        owners there). Batch-level: called once a step on all rows (with GradCache, on the cached ones), by the
        encoder or the LightningModule."""
        return TrainingViews(split_views(rows["embedding"], n), self.contrastive_weight, self.own_terms(rows, n))


class HeadHooks:
    """How a head is built and checked, and how a pooling accepts or refuses a head that makes the sentence vector
    itself (SARCSE).

    `build_encoder` (encoders/build.py, `attach_head`) calls `pooling.with_head(head)` for such a head, before
    any model loads; a head that keeps the pooling's vector instead (`AroundPooling`, `wraps_pooling`) is
    put around the pooling and never reaches `with_head`. What a head needs from the builder is declared on its
    class (`loads_output_layer`, `built_with`) and its sources are checked before the run (`check_sources`).
    """

    # the head goes around the pooling and keeps its vector (`AroundPooling`), else it takes the pooling's place
    wraps_pooling: bool = False
    # the builder loads the causal-LM model and hands its output layer to `built_with` (MNTP's lm_head); read from the
    # class before anything loads
    loads_output_layer: bool = False
    # a head that makes the sentence vector itself: why a pooling whose own output it would replace refuses it
    # (`refuse_head`), and the poolings that take it
    replaces_pooling: str = (
        "the head builds the sentence vector itself from the token states, so that pooling would be ignored. "
        "Fix: pooling=cls"
    )

    @classmethod
    def built_with(cls, backbone: nn.Module, output_layer: nn.Module | None) -> dict[str, Any]:
        """The head's constructor arguments taken from the loaded backbone (before any layer is frozen or an adapter
        added) and its output layer when `loads_output_layer`: none by default."""
        return {}

    def check_sources(self) -> None:
        """The models or files the head loads at fit start are there (the pre-run checks call this): nothing to check
        by default."""

    def with_head(self, head: Pooling) -> Pooling:
        """The pooling once a head that makes the sentence vector itself (SARCSE) is added: by default the head, in
        the pooling's place (CLS: the head's vector is the sentence vector, from the same token states).

        A pooling whose own output the head would silently replace refuses here (`refuse_head`: mean, prompt); one
        that aggregates vectors returns itself with the head inside (HiCL: SARCSE on every segment).
        """
        return head


def refuse_head(setting: str, head: Pooling) -> NoReturn:
    """A head with a pooling whose output it would silently replace: refused with the head's own reason and fix
    (`HeadHooks.replaces_pooling`, `HeadHooks.with_head`)."""
    declared = declared_part(head)
    name = declared.name if declared is not None else type(head).__name__
    raise SentembConfigError(f"head={name} with {setting}: {head.replaces_pooling}")


class ServingHooks:
    """How a pooling becomes one ONNX graph; only format=onnx reads these (nothing in training or encode() does).

    `check_graph_parts` (encoders/serving/onnx_graph.py) reads `graph_refusal` from the class before any model
    loads; the export writes `serving_rows` into the folder's `sentemb_onnx.json` and traces
    `forward(hidden, graph_batch(rows))` inside the graph. The defaults fit a pooling that reads the
    tokenizer's rows as they are (CLS, mean): no refusal, plain rows, the batch as it is.

    The folder's loader is encoders/serving/onnx_embedder.py, copied verbatim into every folder as
    `sentemb_onnx.py`: it runs where sentemb is not installed, so it imports only numpy, onnxruntime and
    tokenizers (no torch, no transformers, no sentemb), and onnxruntime only when a graph loads. A pooling
    that lays out its rows (the prompt's template, last-token's EOS) does so in `prepare` with that module's
    `prepared_rows` and the dict its `serving_rows` returns, importing it in its own module
    (encoder_poolings.py, decoder_poolings.py): training, encode() and the exported folder lay out a sentence
    with the one function, so they cannot drift apart. This module needs no such import: the defaults lay out
    nothing.
    """

    # why this pooling cannot be one ONNX graph (format=onnx refuses it, naming this), or None; a class attribute,
    # read from the class before anything is built
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
        """What `forward` reads, computed from prepared rows alone (inside an ONNX graph); by default the rows, all
        a pooling reads that adds nothing to its batch in `prepare` (the prompt adds its mask position)."""
        return batch


class Pooling(TrainingHooks, HeadHooks, ServingHooks, nn.Module):
    """Token states → sentence vectors; every pooling and head is one.

    What a pooling implements:
    1. `__init__(self, hidden_size, ...)`: `build_encoder` passes the backbone's hidden size, then the
       part's options (conf/pooling/<name>.yaml); call `super().__init__()` (nn.Module's) first;
    2. `forward(hidden, batch, train_head=False)`: (B, T, H) token states and the prepared batch → (B, D)
       sentence vectors; `train_head=True` on the training path only (SimCSE's train-only MLP);
    3. optionally `prepare(batch, tokenizer)`: the backbone's rows for a tokenised batch, plus what
       `forward` reads (by default the batch as it is).

    The rest are hooks with defaults, documented where they are defined: `TrainingHooks` (training,
    GradCache), `HeadHooks` (heads) and `ServingHooks` (format=onnx).
    """

    # the backbone layers whose token states `forward` receives, averaged: indices into transformers' `hidden_states`
    # (0 the embedding output, 1 the first transformer layer, -1 the last); None: the last layer's alone
    hidden_layers: tuple[int, ...] | None = None

    def prepare(self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
        """The backbone's input rows for a tokenised batch (a template, segments), plus what later calls read.
        Called by `SentenceEncoder.hidden_states` (encode()) and `training_batch`; by default the batch as it is."""
        return batch

    def side_rows(
        self, prepared: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase, train_head: bool
    ) -> dict[str, torch.Tensor] | None:
        """Rows of the pooling's own that the backbone computes beside `prepared` (input_ids, attention_mask, optional
        token_type_ids and position_ids, the latter from 0 as BERT numbers them), whose last-layer states `forward`
        then reads as batch["side_states"] and this dict's other entries as batch["side_<key>"] (PromptBERT's template
        alone: denoise). Called by the encoder on every call that has `prepared` (a GradCache chunk: that chunk's).
        None by default: no side rows."""
        return None

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        """(B, T, H) token states of the prepared rows → (B, D) sentence vectors; every pooling defines it."""
        raise NotImplementedError(f"{type(self).__name__} defines no forward(hidden, batch, train_head)")


class AroundPooling(Pooling):
    """A head that keeps its pooling's sentence vector and adds a training term of its own (MNTP).

    `build_encoder` calls `around(pooling)`; `prepare`, `forward`, `contrastive_weight` and the training hooks go to
    the pooling inside unless the head overrides them (typically `training_views`, to add an auxiliary (weight,
    loss) term; `own_terms` is left to the inner pooling's own `training_views`). Its head and serving hooks
    stay the defaults: such a head declares `export=TRAINS_ONLY`, and an export serves the pooling inside without it
    (export.py's `inference_parts`)."""

    wraps_pooling = True  # build_encoder calls `around(pooling)`: the pooling's vector stays the embedding

    def __init__(self) -> None:
        super().__init__()
        self.inner: Pooling | None = None

    def around(self, pooling: Pooling) -> AroundPooling:
        """This head with `pooling` inside."""
        self.inner = pooling
        return self

    def own_term_labels(self) -> set[str]:
        return set(self.term_labels) | (self.inner.own_term_labels() if self.inner is not None else set())

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
