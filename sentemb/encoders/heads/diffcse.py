"""DiffCSE (Chuang et al., NAACL 2022): SimCSE plus conditional replaced-token detection (RTD).

A frozen generator edits each view's tokens; a discriminator (its own transformer, initialised from
the encoder's weights) reads the edited tokens with the view's sentence embedding z in place of the
embedding layer's output at position 0 and predicts, per token, whether it was replaced:

    x̃ = mask(x, p)          each real non-special token selected with probability p (masking_ratio); of the
                            selected: 80% [MASK], 10% a random id, 10% unchanged (as BERT's MLM collator)
    x'' = G(x̃)              the edit (below, per `generator` and `convention`)
    y_t = 1[x''_t ≠ x_t]    on real tokens (0 on padding)
    L_RTD = CE(head(D(x'', cls = z))_t, y_t)   averaged over tokens (below)
    L = L_contrastive(z⁽¹⁾, z⁽²⁾) + λ·L_RTD                                          (DiffCSE Eq. 3)

z is the projector's output (Linear(H,2H) → BatchNorm → ReLU → Linear(2H,H) → BatchNorm without
affine, over the 2B rows of both views, the released `--batchnorm` ProjectionMLP) in place of SimCSE's
train-only MLP; both views feed the contrastive loss and each conditions its own RTD. No stop-gradient:
the RTD term trains the discriminator, the projector and the encoder, the encoder only through z (the
edited ids carry no gradient). Evaluation uses the pooling's raw vector (no projector).

`convention`: `paper` samples each selected token's replacement from the generator's distribution
(other tokens kept) and averages the RTD loss over real tokens; `reference` does what voidism/DiffCSE's
code does: x'' = argmax G(x̃) at every position (generator dropout on), position 0 forced back to the
row's first token, padding set to id 0, and the cross-entropy averaged over all 2B×L positions
(padding, label 0, and position 0 included).

`generator`: `uniform` (the offline fallback: each selected token replaced by an id drawn uniformly
from the vocabulary's non-special ids; no masked LM is needed), `tiny` (a 2-layer random masked LM
built in-process, for tests), or a masked LM's hub name or folder whose vocabulary is the encoder's
(distilbert-base-uncased for BERT, distilroberta-base for RoBERTa, as the released code). The
generator is never trained, never saved (a `FrozenModel`, outside the module's state) and rebuilt at fit
start; with `adapter=lora` too.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM, PreTrainedTokenizerBase

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import NON_NEGATIVE, OPEN_UNIT, require_number
from sentemb.common.parts import ENCODERS, TRAINS_ONLY, part
from sentemb.encoders.models.backbones import NO_REMOTE_CODE, check_model_source
from sentemb.encoders.models.frozen import FrozenModel
from sentemb.encoders.models.model_files import transformers_refusals
from sentemb.encoders.poolings.base import AroundPooling, Pooling, TrainingViews, split_views

CONVENTIONS = ("paper", "reference")
BUILT_IN_GENERATORS = ("uniform", "tiny")
EDITED, REPLACED = "diffcse_edited_ids", "diffcse_replaced"  # keys the head adds to the prepared training rows


def check_diffcse_options(generator: object, masking_ratio: object, weight: object, convention: object) -> None:
    """The head's options, refused with the key and a fix (no model is loaded)."""
    if not isinstance(generator, str) or not generator:
        raise SentembConfigError(
            f"head.generator={generator!r}: name uniform (offline fallback), tiny (tests), or a masked LM's hub "
            "name or folder (e.g. distilbert-base-uncased). Fix: head.generator=uniform"
        )
    require_number("head.masking_ratio", masking_ratio, OPEN_UNIT, "head.masking_ratio=0.3 (BERT) or 0.2 (RoBERTa)")
    require_number("head.weight", weight, NON_NEGATIVE, "head.weight=0.005 (λ)")
    if convention not in CONVENTIONS:
        raise SentembConfigError(f"head.convention={convention!r}: use paper or reference")


def selected_positions(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: torch.Tensor, ratio: float
) -> torch.Tensor:
    """(B, L) bool: each real, non-special token selected with probability `ratio` (torch's global RNG)."""
    maskable = attention_mask.bool() & ~torch.isin(input_ids, special_ids)
    draws = torch.rand(input_ids.shape, device=input_ids.device)
    return maskable & (draws < ratio)


def masked_inputs(input_ids: torch.Tensor, selected: torch.Tensor, mask_id: int, vocab_size: int) -> torch.Tensor:
    """The generator's input: of the selected tokens 80% become `mask_id`, 10% a random id of the whole vocabulary
    (as the released collator), 10% stay."""
    to_mask = selected & (torch.rand(input_ids.shape, device=input_ids.device) < 0.8)
    to_random = selected & ~to_mask & (torch.rand(input_ids.shape, device=input_ids.device) < 0.5)
    random_ids = torch.randint(vocab_size, input_ids.shape, device=input_ids.device)
    return torch.where(to_mask, mask_id, torch.where(to_random, random_ids, input_ids))


def tiny_masked_lm(vocab_size: int) -> BertForMaskedLM:
    """A 2-layer, 32-wide random BERT masked LM over the tokenizer's ids (tests), the same weights every time and
    without touching the global RNG (a resumed run rebuilds it identically)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = BertConfig(
            vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
        )
        return BertForMaskedLM(config)


def pretrained_masked_lm(name_or_path: str, tokenizer: PreTrainedTokenizerBase) -> nn.Module:
    """A hub or folder masked LM whose vocabulary is the encoder's (its ids are the encoder's ids), else refused."""
    check_model_source(name_or_path, key="head.generator")
    with transformers_refusals(name_or_path, "head.generator"):
        own = AutoTokenizer.from_pretrained(name_or_path, **NO_REMOTE_CODE)
    if own.get_vocab() != tokenizer.get_vocab():
        raise SentembConfigError(
            f"head.generator={name_or_path}: its vocabulary differs from the encoder's tokenizer, so its predicted ids "
            "would be other tokens. Fix: a masked LM of the encoder's family (distilbert-base-uncased for BERT "
            "uncased, distilroberta-base for RoBERTa), or head.generator=uniform"
        )
    with transformers_refusals(name_or_path, "head.generator"):
        return AutoModelForMaskedLM.from_pretrained(name_or_path, **NO_REMOTE_CODE)


def conditioned(discriminator: nn.Module, z: torch.Tensor) -> torch.utils.hooks.RemovableHandle:
    """The discriminator's embedding output at position 0 replaced by z (released modeling_bert's `cls_input`), for
    the calls made until the returned handle is removed."""

    def replace_first(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return torch.cat([z[:, None].to(output.dtype), output[:, 1:]], dim=1)

    return discriminator.embeddings.register_forward_hook(replace_first)


@part(
    "head",
    "diffcse",
    serves=ENCODERS,
    why_not="its discriminator is a BERT/RoBERTa conditioned through the [CLS] position of the embedding layer",
    export=TRAINS_ONLY,
    companions=("pooling.mlp=none",),  # its projector takes the MLP's place
)
class DiffCSEHead(AroundPooling):
    """DiffCSE's projector, generator and discriminator around an encoder pooling (module docstring)."""

    term_labels = ("rtd",)  # λ·L_RTD

    @classmethod
    def built_with(cls, backbone: nn.Module, output_layer: nn.Module | None) -> dict[str, Any]:
        """The discriminator's initial weights: a trainable copy of the pretrained backbone, whole (no freezing, no
        adapter; the released code loads the encoder's pretrained checkpoint into it)."""
        start = copy.deepcopy(backbone)
        start.requires_grad_(True)
        return {"backbone": start}

    def __init__(
        self,
        hidden_size: int,
        special_ids: Any,
        backbone: nn.Module | None = None,
        generator: str = "uniform",
        masking_ratio: float = 0.3,
        weight: float = 0.005,
        convention: str = "paper",
    ) -> None:
        super().__init__()
        check_diffcse_options(generator, masking_ratio, weight, convention)
        self.generator_name, self.masking_ratio = generator, float(masking_ratio)
        self.weight, self.convention = float(weight), convention
        self.projector = nn.Sequential(
            nn.Linear(hidden_size, 2 * hidden_size, bias=False),
            nn.BatchNorm1d(2 * hidden_size),
            nn.ReLU(),
            nn.Linear(2 * hidden_size, hidden_size, bias=False),
            nn.BatchNorm1d(hidden_size, affine=False),
        )
        self.discriminator = backbone  # None only where a config is checked without a model
        self.rtd_head = nn.Linear(hidden_size, 2)
        self.register_buffer("special_token_ids", torch.tensor(sorted(special_ids), dtype=torch.long), persistent=False)
        self.frozen = FrozenModel()  # the generator, outside the module's state (never trained nor saved)
        self.mask_id: int | None = None
        self.vocab_size = 0

    def around(self, pooling: Pooling) -> DiffCSEHead:
        """This head around `pooling`, which must read the sentence's own tokens and leave the projector its place."""
        if type(pooling).prepare is not Pooling.prepare or pooling.hidden_layers is not None:
            raise SentembConfigError(
                f"head=diffcse with {type(pooling).__name__}: the discriminator is conditioned on the sentence's own "
                "tokens, which this pooling lays out otherwise (a template, segments, several layers). "
                "Fix: pooling=cls pooling.mlp=none (DiffCSE's)"
            )
        if getattr(pooling, "mlp", None) is not None:
            raise SentembConfigError(
                "head=diffcse with a pooling MLP: DiffCSE's projector takes the place of SimCSE's train-only MLP. "
                "Fix: pooling.mlp=none"
            )
        return super().around(pooling)

    # ------------------------------------------------------------------ generator
    def check_sources(self) -> None:
        """The generator a fit will load is a folder, cached or reachable (the pre-run checks call this)."""
        if self.generator_name not in BUILT_IN_GENERATORS:
            check_model_source(self.generator_name, key="head.generator")

    def prepare_training(self, tokenizer: PreTrainedTokenizerBase) -> None:
        """The inner pooling's, then the generator built (outside the state) and the tokenizer's ids read."""
        self.inner_pooling().prepare_training(tokenizer)
        if self.discriminator is None:
            raise RuntimeError("DiffCSEHead has no discriminator: build it with build_encoder (a backbone copy)")
        self.mask_id, self.vocab_size = tokenizer.mask_token_id, len(tokenizer)
        if self.mask_id is None:
            raise SentembConfigError("head=diffcse: the tokenizer has no mask token. Fix: a BERT or RoBERTa tokenizer")
        if self.generator_name == "uniform":
            self.frozen.hold(None)
        elif self.generator_name == "tiny":
            self.frozen.hold(tiny_masked_lm(self.vocab_size))
        else:
            self.frozen.hold(pretrained_masked_lm(self.generator_name, tokenizer))

    @torch.no_grad()
    def edited(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x'', y): the edited ids and the replaced-token labels (long, 0 on padding) of each row."""
        if self.mask_id is None:
            raise RuntimeError("DiffCSEHead.prepare_training(tokenizer) was not called (a fit calls it)")
        selected = selected_positions(input_ids, attention_mask, self.special_token_ids, self.masking_ratio)
        model = self.frozen.on(input_ids.device)  # the released code edits with the generator's dropout on
        if model is None:  # uniform: each selected token replaced by a non-special id drawn uniformly
            choices = torch.arange(self.vocab_size, device=input_ids.device)
            choices = choices[~torch.isin(choices, self.special_token_ids)]
            drawn = choices[torch.randint(len(choices), input_ids.shape, device=input_ids.device)]
            edit = torch.where(selected, drawn, input_ids)
        else:
            masked = masked_inputs(input_ids, selected, self.mask_id, self.vocab_size)
            logits = model(input_ids=masked, attention_mask=attention_mask).logits.float()
            if self.convention == "reference":  # argmax everywhere, first token restored, padding id 0
                edit = logits.argmax(-1)
                edit[:, 0] = input_ids[:, 0]
                edit = edit * attention_mask
            else:  # the paper: a sample from G at the selected positions, the rest kept
                sample = torch.distributions.Categorical(logits=logits).sample()
                edit = torch.where(selected, sample, input_ids)
        replaced = (edit != input_ids) & attention_mask.bool()
        return edit.to(input_ids.dtype), replaced.long()

    def training_batch(
        self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        """The inner pooling's view rows, and each row's edited ids and replaced-token labels."""
        rows = self.inner_pooling().training_batch(batch, tokenizer)
        edit, replaced = self.edited(rows["input_ids"], rows["attention_mask"])
        return {**rows, EDITED: edit, REPLACED: replaced}

    # ------------------------------------------------------------------ discriminator
    def rtd_logits(self, edited: torch.Tensor, attention_mask: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """(R, L, 2) logits of D(x'', cls = z)."""
        handle = conditioned(self.discriminator, z)
        try:
            states = self.discriminator(input_ids=edited, attention_mask=attention_mask).last_hidden_state
        finally:
            handle.remove()
        return self.rtd_head(states)

    def rtd_loss(self, logits: torch.Tensor, replaced: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The 2-way cross-entropy, averaged over real tokens (paper) or over every position (reference)."""
        losses = F.cross_entropy(logits.float().flatten(0, 1), replaced.flatten(), reduction="none")
        if self.convention == "reference":
            return losses.mean()
        mask = attention_mask.flatten().to(losses.dtype)
        return (losses * mask).sum() / mask.sum().clamp_min(1)

    def training_views(self, rows: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], n: int) -> TrainingViews:
        """The projector over the inner pooling's views (one BatchNorm over all their rows), and ("rtd", (λ, L_RTD))
        from the anchor and positive views, each conditioned on its own z (a view after them is projected only)."""
        inner_batch = {key: value for key, value in batch.items() if key not in (EDITED, REPLACED)}
        views = self.inner_pooling().training_views(rows, inner_batch, n)
        projected = self.projector(torch.cat(views.embeddings))  # every view, one BatchNorm over their rows
        z = projected[: 2 * n]
        mask = batch["attention_mask"][: 2 * n]
        logits = self.rtd_logits(batch[EDITED][: 2 * n], mask, z)
        loss = self.rtd_loss(logits, batch[REPLACED][: 2 * n], mask)
        auxiliary = {**views.own_terms, "rtd": (self.weight, loss)}
        return replace(views, embeddings=split_views(projected, n), own_terms=auxiliary)
