"""The encoder poolings: [CLS], mean and PromptBERT's [MASK] (the interface they implement: base.py).

`train_head=True` is the training path: CLS pooling then adds SimCSE's MLP (Linear+Tanh),
which evaluation never uses (SimCSE §3: "we take [CLS] without MLP at test time").
`mlp_activation` and `mlp_init_std` give the paradigm paper's code's MLP instead
(isotropy/models.py MLPLayer and custom_param_init: one Linear, Tanh before it for RoBERTa and
none for BERT, weight and bias drawn from N(0, 6e-3)).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from transformers import PreTrainedTokenizerBase

from sentemb.common.batch_views import training_view_batches
from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import POSITIVE, require_number
from sentemb.common.parts import ENCODERS, NATIVE, part
from sentemb.encoders.poolings.base import Pooling, refuse_head
from sentemb.encoders.poolings.templates import (
    PROMPTBERT_TEMPLATE,
    TokenTemplate,
    check_room,
    check_template,
    model_max_length,
    real_ids,
    rebatch,
)
from sentemb.encoders.serving.onnx_embedder import prepared_rows

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
    if init_std is not None:
        require_number("pooling.mlp_init_std", init_std, POSITIVE, "e.g. 0.02, or null for nn.Linear's own")
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
        refuse_head("pooling=mean", head)

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)


FIRST_LAYERS = {"layer": 1, "embeddings": 0}


@part(
    "pooling",
    "first_last_avg",
    serves=ENCODERS,
    why_not="it is SimCSE's post-hoc baseline over a BERT's layers (pooling=mean serves decoders)",
)
class FirstLastAvgPooling(MeanPooling):
    """SimCSE's post-hoc baseline `avg_first_last`: the first transformer layer's and the last layer's token states
    averaged, then the mean over real tokens. `first=embeddings` averages the embedding layer's output with the last
    layer instead (the form some released evaluation code has: transformers' `hidden_states[0]`)."""

    def __init__(self, hidden_size: int, first: str = "layer") -> None:
        super().__init__(hidden_size)
        if first not in FIRST_LAYERS:
            raise SentembConfigError(f"pooling.first={first!r}: use layer (SimCSE's) or embeddings")
        self.first = first
        self.hidden_layers = (FIRST_LAYERS[first], -1)

    def with_head(self, head: Pooling) -> Pooling:
        refuse_head("pooling=first_last_avg", head)


@part(
    "pooling",
    "avg_top2",
    serves=ENCODERS,
    why_not="it is SimCSE's post-hoc baseline over a BERT's layers (pooling=mean serves decoders)",
)
class AvgTop2Pooling(MeanPooling):
    """The last two layers' token states averaged, then the mean over real tokens (a post-hoc baseline of Table 2)."""

    hidden_layers = (-2, -1)

    def with_head(self, head: Pooling) -> Pooling:
        refuse_head("pooling=avg_top2", head)


@part(
    "pooling", "prompt", serves=ENCODERS, why_not="decoders have no [MASK] token (pooling=prompt_eol is their prompt)"
)
class PromptPooling(Pooling):
    """PromptBERT's [MASK] state: each sentence is wrapped in a template, the mask token's hidden state
    is the embedding (plus SimCSE's train-only MLP unless mlp=none).

    The template is applied to token ids inside the encoder's forward (`prepare`), for training and
    for `encode()` alike; the sentence is truncated to fit `max_length` (default: the tokenizer's
    limit), never the template or the mask. Reference: Jiang et al., PromptBERT (EMNLP 2022).

    `positive_template`: the template of the training views after the anchor (the positive and SNCSE's soft
    negative), as SNCSE's released code trains (`This sentence of "[X]" means [MASK] .`); the anchor's `template`
    is the one used at test time. None: every view uses `template` (PromptBERT).

    `denoise`: PromptBERT's template denoising in training (its released code, kongds/Prompt-BERT
    prompt_bert/models.py, `cl_forward`: `get_delta` lines 78-107 and the subtraction lines 159-177, on with
    `--mask_embedding_sentence_delta` in run.sh's unsup-bert): the template is encoded with an empty sentence, its
    positions after the prefix shifted by the sentence's length k (as if k tokens stood there), and that [MASK]
    state is subtracted from each sentence's before the MLP; gradients flow through it, as the released code's
    (`mask_embedding_sentence_delta_freeze` off). One template row per distinct (template, k) of the rows computed
    together (the released code: one per k < 50, shared by the sentences of that length). Training only: the
    released unsupervised recipe evaluates without it (run.sh's unsup-bert eargs have no
    `--mask_embedding_sentence_delta`), so encode() never subtracts.
    """

    def __init__(
        self,
        hidden_size: int,
        template: str = PROMPTBERT_TEMPLATE,
        mlp: str = "train",
        max_length: int | None = None,
        mlp_activation: str = "after",
        mlp_init_std: float | None = None,
        positive_template: str | None = None,
        denoise: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(denoise, bool):
            raise SentembConfigError(
                f"pooling.denoise={denoise!r} must be true (PromptBERT's template denoising in training) or false"
            )
        self.denoise = denoise
        self.template = check_template(template)
        positive = positive_template
        self.positive_template = check_template(positive, "pooling.positive_template") if positive else None
        self.max_length = max_length
        self.mlp_use, self.mlp_activation = mlp, mlp_activation
        self.mlp = projection_mlp(hidden_size, mlp, mlp_activation, mlp_init_std)

    def with_head(self, head: Pooling) -> Pooling:
        refuse_head("pooling=prompt", head)

    def prepare(self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
        """Rewrite a tokenised batch into templated rows (the sentence's own tokens kept, truncated to fit),
        with each row's mask position."""
        rows = prepared_rows(real_ids(batch), self.serving_rows(tokenizer))
        return rebatch(rows, batch, tokenizer.pad_token_id, tokenizer.mask_token_id)

    def training_batch(
        self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        """The anchor's rows in `template`, the other views' (positive, soft negative) in `positive_template`."""
        anchor, *others = training_view_batches(batch)
        rows = prepared_rows(real_ids(anchor), self.serving_rows(tokenizer))
        later = self.serving_rows(tokenizer, self.positive_template or self.template)
        for view in others:
            rows += prepared_rows(real_ids(view), later)
        prepared = rebatch(rows, anchor, tokenizer.pad_token_id, tokenizer.mask_token_id)
        if self.denoise:  # which template each row is in (0: the anchor's, 1: the later views'), for its side row
            anchors = anchor["input_ids"].shape[0]
            prepared["template_id"] = (torch.arange(len(rows), device=prepared["input_ids"].device) >= anchors).long()
        return prepared

    def side_rows(
        self, prepared: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase, train_head: bool
    ) -> dict[str, torch.Tensor] | None:
        """denoise, in training: the templates alone, one row per distinct (template, sentence length k) of
        `prepared`, positions after the prefix shifted by k (the released `get_delta`: d_position_ids[:, len(bs)+1:]
        += k), each row's [MASK] position and which side row each prepared row subtracts (`row_index`)."""
        if not (self.denoise and train_head):
            return None
        later = self.positive_template or self.template
        templates = [TokenTemplate.build(tokenizer, text) for text in (self.template, later)]
        device = prepared["input_ids"].device
        which = prepared.get("template_id", torch.zeros_like(prepared["input_ids"][:, 0]))
        overhead = torch.tensor([t.overhead for t in templates], device=device)[which]
        length = prepared["attention_mask"].sum(dim=1) - overhead  # the released blen: real tokens less the template
        pairs, row_index = torch.unique(torch.stack([which, length], dim=1), dim=0, return_inverse=True)
        rows, positions = [], []
        for template_number, shift in pairs.tolist():
            template = templates[template_number]
            ids = [*template.start, *template.prefix, *template.suffix, *template.end]
            position = torch.arange(len(ids))
            position[len(template.start) + len(template.prefix) :] += shift
            rows.append(ids)
            positions.append(position)
        side = rebatch(rows, prepared, tokenizer.pad_token_id, tokenizer.mask_token_id)
        side["position_ids"] = pad_sequence(positions, batch_first=True).to(device)
        side["row_index"] = row_index
        return side

    def serving_rows(self, tokenizer: PreTrainedTokenizerBase, template_text: str | None = None) -> dict[str, Any]:
        """The template (`template_text`, default the anchor's) at the token level (TokenTemplate): specials stripped, a
        literal mask token made [UNK], the sentence cut to fit; right padding, as `rebatch` pads."""
        template = TokenTemplate.build(tokenizer, template_text or self.template)
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
        if self.denoise and train_head:  # the template's own [MASK] state subtracted (side_rows), before the MLP
            if "side_states" not in batch:
                raise RuntimeError(
                    "PromptPooling(denoise=True) needs its side rows' states: call it through SentenceEncoder"
                )
            side = batch["side_states"]
            template_states = side[torch.arange(side.shape[0], device=side.device), batch["side_mask_position"]]
            state = state - template_states[batch["side_row_index"]]
        if self.mlp is not None and (self.mlp_use == "always" or train_head):
            return self.mlp(state)
        return state
