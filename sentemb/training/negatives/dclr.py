"""DCLR (Zhou et al., ACL 2022): false negatives left out of the loss, and noise negatives pushed by gradient ascent.

    n_k ~ N(0, I_D), M = int(N·noise_times) rows, then `ascent_steps` times (the released code's `pgd`):
        g = ∇_n CE([S | Sⁿ], i),  S_ij = cos(z_i, z⁺_j)/τ,  Sⁿ_ik = cos(z_i, n_k)/τ     (unweighted, mean over i)
        n ← n + step_size · g/‖g‖₂ (row-wise),  NaN → 0
    α_ij = 0 if cos(c_i, c⁺_j) > φ (j ≠ i) else 1     (c, c⁺: the frozen complementary model's, both views)
    L_i = −log e^{s_ii/τ} / Σ_{j ∈ batch ∪ noise} α_ij e^{s_ij/τ}                 (DCLR's weighted InfoNCE)

`convention: paper` (default): the false negatives are the configured loss's `excluded` candidates
(`Objective.forward(z1, z2, negatives=noise, excluded=...)`): a loss with a negatives' denominator drops
them (α = 0), and the noise rows are its extra negatives, never excluded. `convention: reference` is
RUCAIBox/DCLR's simcse/models.py `cl_vat_forward` (spec §4): a false negative is cos(c_i, c⁺_j)/τ > 20·φ
(20 = 1/0.05 hard-coded there, τ the loss's), the loss is `reference_loss` (a binary cross-entropy over
row-softmax([S | Sⁿ] ⊙ [W | 1]): the weight multiplies the logit), loss=infonce only; and the training
step gives the encoder and the complementary model an all-ones attention mask (the released forward
passes none: padding is attended, by both; dev and test evaluation keep the mask). Under `reference`
the encoder's pooling reads the same all-ones mask (a mean pooling then averages padding too).

The complementary model (`complementary`) is frozen and never trained: outside the module's submodules
(a `FrozenModel`), so it is in no state dict, checkpoint, export, DDP bucket nor optimizer; it is
rebuilt, not restored, when a run resumes. It runs in train mode (dropout on, as the released code) under
no_grad on both views of the batch (unsupervised SimCSE: the batch twice), on the batch's device; under
DDP its embeddings are gathered like the z's. Its sources:
- `initial` (default; needs nothing offline): a frozen copy of the encoder as the module builds it (its
  initial weights: taken in `track`, before any checkpoint loads and before compile; frozen weights shared,
  not copied), c = its training representation (pooling and train-only MLP, as SimCSE's trained MLP is the
  released complementary model's pooler);
- a sentemb checkpoint (`<path>.ckpt`, e.g. an unsupervised SimCSE run): its encoder, c its training
  representation; its tokenizer's vocabulary must be the run's;
- a Hugging Face SimCSE model, a folder or hub name (the released runs: princeton-nlp/unsup-simcse-bert-base-uncased,
  …-roberta-base): `AutoModel.from_pretrained(name, add_pooling_layer=True)`, c = its pooler_output (SimCSE's
  MLP, renamed pooler in its HF conversion); its tokenizer's vocabulary must be the run's.

State: none. The noise is drawn fresh each step from torch's global RNG on z's device (a checkpoint's RNG
states restore it); under DDP rank 0's draw is broadcast, so every rank computes the same global loss.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sentemb.common.batch_views import training_view_batches
from sentemb.common.errors import SentembConfigError
from sentemb.common.memory import in_gib
from sentemb.common.numbers import NON_NEGATIVE, POSITIVE, Bounds, require_number, require_whole
from sentemb.common.parts import lookup, part
from sentemb.encoders.encoder import BACKBONE_INPUTS
from sentemb.encoders.models.backbones import declared_hidden_size
from sentemb.encoders.models.frozen import FrozenModel
from sentemb.encoders.models.model_files import memory_short_of
from sentemb.losses.base import LazyStats, LossOutput, normalize
from sentemb.losses.geometry import paradigm_stats
from sentemb.losses.registry import negatives_losses
from sentemb.training.distributed import world_size
from sentemb.training.negatives.base import (
    CONVENTIONS,
    NegativesPart,
    StepInputs,
    StepNegatives,
    apply_negatives,
    gathered,
    in_chunks,
    refuse_loss_without_negatives,
    refuse_sharded,
)

if TYPE_CHECKING:
    from sentemb.encoders.encoder import SentenceEncoder

INITIAL = "initial"  # the encoder's own initial weights, frozen
KEY = "negatives.complementary"
REFERENCE_SCALE = 20.0  # the released code's `cos_sim_fix > phi * 20`, its cos_sim_fix = cos/τ (20 = 1/0.05)
EXCLUDED_SHARE = "train/dclr/excluded_share"
MAX_NOISE_TIMES = 64.0  # 25x DCLR's largest (2.5, RoBERTa-base); the memory it needs is checked against the machine's
MAX_ASCENT_STEPS = 1000  # 250x the released code's 4


def tempered_losses() -> str:
    """The registered losses that take extra negatives and have a temperature τ (others need ascent_tau)."""
    return ", ".join(
        name for name in negatives_losses() if "tau" in inspect.signature(lookup("loss", name).build).parameters
    )


@part("negatives", "dclr")
class DCLRNegatives(NegativesPart):
    """DCLR's noise negatives and false-negative exclusion; built empty, then `track(encoder)` builds the
    complementary model."""

    def __init__(
        self,
        noise_times: float = 1.0,
        ascent_steps: int = 4,
        step_size: float = 1.0e-3,
        phi: float = 0.9,
        complementary: str = INITIAL,
        convention: str = "paper",
        ascent_tau: float | None = None,
    ) -> None:
        super().__init__()
        # noise rows per sentence of the batch (0: none), bounded: each is a (D,) row and a logit column per anchor
        noise_times = require_number(
            "negatives.noise_times",
            noise_times,
            Bounds(0.0, MAX_NOISE_TIMES),
            "e.g. negatives.noise_times=1 (DCLR's BERT-base; 2.5 for RoBERTa-base)",
        )
        # gradient-ascent steps on the noise (0: Gaussian noise as drawn), each a forward and backward of the logits
        require_whole(
            "negatives.ascent_steps", ascent_steps, Bounds(0, MAX_ASCENT_STEPS), "negatives.ascent_steps=4 (pgd)"
        )
        require_number(
            "negatives.step_size", step_size, NON_NEGATIVE, "negatives.step_size=1.0e-3 (the released code's)"
        )
        # the complementary cosine above which a negative is a false one
        require_number("negatives.phi", phi, Bounds(0.0, 1.0, low_open=True), "negatives.phi=0.9 (0.85 for RoBERTa)")
        if not (isinstance(complementary, str) and complementary.strip()):
            raise SentembConfigError(
                f"{KEY}={complementary!r} must be `initial`, a sentemb .ckpt or a Hugging Face SimCSE model. "
                f"Fix: {KEY}=initial, or {KEY}=princeton-nlp/unsup-simcse-bert-base-uncased"
            )
        if convention not in CONVENTIONS:
            raise SentembConfigError(
                f"negatives.convention={convention!r} is not one of {', '.join(CONVENTIONS)}. "
                "Fix: negatives.convention=paper (or reference: the released code's loss)"
            )
        if ascent_tau is not None:  # null: the loss's loss.tau
            require_number("negatives.ascent_tau", ascent_tau, POSITIVE, "negatives.ascent_tau=0.05, or null")
        self.ascent_tau = None if ascent_tau is None else float(ascent_tau)
        self.noise_times, self.ascent_steps, self.step_size = float(noise_times), ascent_steps, float(step_size)
        self.phi, self.complementary, self.convention = float(phi), complementary, convention
        self.frozen = FrozenModel()  # the complementary model, outside the state

    # ---- the pre-run check

    def check_config(self, cfg: Mapping[str, Any]) -> None:
        """What negatives=dclr cannot go with, before any model loads (its options: its constructor): a loss without
        extra negatives or a temperature, another loss than infonce (or a symmetric one) under `reference`,
        trainer=fsdp; and the complementary model's source must be there."""
        why = "DCLR adds noise negatives to, and removes false negatives from, a loss's denominator."
        refuse_loss_without_negatives(cfg, "negatives=dclr", why, tempered_losses())
        loss = cfg.get("loss") or {}
        name = loss.get("name")
        if self.ascent_tau is None and "tau" not in inspect.signature(lookup("loss", name).build).parameters:
            raise SentembConfigError(
                f"negatives=dclr with loss={name}: the loss has no temperature loss.tau, which the noise's gradient "
                "ascent reads by default. Fix: negatives.ascent_tau=0.05 (DCLR's temperature), or a loss with τ "
                f"({tempered_losses()})"
            )
        if self.convention == "reference":
            if name != "infonce":
                raise SentembConfigError(
                    f"negatives.convention=reference with loss={name}: the released code's loss is its own binary "
                    "cross-entropy over InfoNCE's softmax, at InfoNCE's τ; no other loss has a counterpart there. "
                    "Fix: loss=infonce, or negatives.convention=paper"
                )
            if loss.get("symmetric"):
                raise SentembConfigError(
                    "negatives.convention=reference with loss.symmetric=true: the released code's loss has one "
                    "direction. Fix: loss.symmetric=false, or negatives.convention=paper"
                )
        refuse_sharded(cfg, "negatives=dclr", "the complementary model is a whole model, not sharded")
        self.check_noise_memory(cfg)
        check_complementary_source(self.complementary)

    def check_noise_memory(self, cfg: Mapping[str, Any]) -> None:
        """The noise a step draws fits the machine: M = N·noise_times rows of the hidden width D (the noise, its
        gradient, its normalised copy) and the N x (N + M) logits with their gradient, N the batch gathered over the
        devices; refused naming negatives.noise_times and data.batch_size before anything is allocated."""
        batch = (cfg.get("data") or {}).get("batch_size")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            return  # the data's own check names it
        devices = (cfg.get("trainer") or {}).get("devices")
        n = batch * (devices if isinstance(devices, int) and not isinstance(devices, bool) and devices > 1 else 1)
        rows = int(n * self.noise_times)
        width = declared_hidden_size(cfg.get("model") or {}) or 0  # unknown before the model loads: counted as 0
        needed = 4 * (3 * rows * width + 2 * n * (n + rows))
        memory = memory_short_of(needed)
        if memory is not None:
            raise SentembConfigError(
                f"negatives.noise_times={self.noise_times:g} with data.batch_size={batch}: each step's {rows:,} noise "
                f"rows and their logits need ~{in_gib(needed)}, more than this machine allows ({in_gib(memory)}). "
                "Fix: a smaller negatives.noise_times (DCLR: 1 for BERT-base, 2.5 for RoBERTa-base) or data.batch_size"
            )

    # ---- the NegativesPart protocol

    def track(self, encoder: SentenceEncoder) -> None:
        """The complementary model, built now (in the module's constructor: `initial` copies the encoder's weights
        before any checkpoint loads)."""
        self.frozen.hold(build_complementary(self.complementary, encoder))

    def training_batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`reference`: every attention mask all ones (the released training forward passes none: padding is
        attended, by the encoder and the complementary model alike); `paper`: the batch."""
        if self.convention != "reference":
            return batch
        unmasked = {key: torch.ones_like(value) for key, value in batch.items() if key.endswith("attention_mask")}
        return {**batch, **unmasked}

    def step_negatives(self, inputs: StepInputs) -> StepNegatives:
        """The noise negatives (from the global z1, z2 at the loss's τ), and the false negatives the complementary
        model finds among the batch (none among the noise columns)."""
        loss = inputs.loss
        tau = float(loss.tau) if hasattr(loss, "tau") else None  # reference: infonce's, checked before the run
        noise = self.noise_negatives(inputs.z1, inputs.z2, self.ascent_tau or tau)
        c1, c2 = self.complementary_embeddings(inputs.batch, inputs.chunk)
        flagged = self.false_negatives(c1, c2, tau)
        n = flagged.shape[0]
        excluded = torch.cat((flagged, flagged.new_zeros(n, noise.shape[0])), dim=1)
        share = flagged.sum(dtype=torch.float32) / max(n * (n - 1), 1)  # of the in-batch negatives
        return StepNegatives(
            negatives=noise if noise.shape[0] else None, excluded=excluded, logged={EXCLUDED_SHARE: share}
        )

    def global_loss(self, inputs: StepInputs, step: StepNegatives) -> LossOutput:
        """`reference`: the released code's loss (`reference_loss`); `paper`: the configured loss's."""
        if self.convention == "reference":
            roles = step.inputs(inputs.roles)  # its candidates after the positives, and the one exclusion mask
            excluded = roles.candidate_exclusion()
            return self.reference_loss(inputs.z1, inputs.z2, roles.others(), excluded, float(inputs.loss.tau))
        return apply_negatives(inputs, step)

    # ---- DCLR's pieces

    def noise_negatives(self, z1: torch.Tensor, z2: torch.Tensor, tau: float) -> torch.Tensor:
        """(M, D) noise negatives, M = int(N·noise_times): n ~ N(0, I_D) from torch's global RNG on z1's device (rank
        0's draw under DDP), then `ascent_steps` steps n ← n + step_size·g/‖g‖₂, g = ∇_n CE([S | Sⁿ], i).

        As the released code (simcse/models.py `cl_vat_forward`): the cross-entropy is the mean over the N anchors,
        unweighted (no false negative removed); ‖g‖₂ is each noise row's norm, without an epsilon, and NaN entries
        of n after a step (a row whose gradient is 0: 0/0) become 0. The gradient is taken of n alone
        (torch.autograd.grad, z detached): no parameter's gradient is touched. Float32, autocast off; the result
        is detached (a constant of the loss).
        """
        n, width = z1.shape
        with torch.autocast(device_type=z1.device.type, enabled=False):
            noise = torch.randn(int(n * self.noise_times), width, device=z1.device)
            if world_size() > 1 and noise.numel():  # one draw for every rank: all compute the same global loss
                dist.broadcast(noise, src=0)
            if noise.shape[0] == 0 or self.ascent_steps == 0:
                return noise
            with torch.enable_grad():
                h1, h2 = normalize(z1.detach().float()), normalize(z2.detach().float())
                batch_logits = h1 @ h2.T / tau
                labels = torch.arange(n, device=z1.device)
                for _ in range(self.ascent_steps):
                    noise = noise.detach().requires_grad_(True)
                    logits = torch.cat((batch_logits, h1 @ normalize(noise).T / tau), dim=1)
                    (gradient,) = torch.autograd.grad(F.cross_entropy(logits, labels), noise)
                    noise = noise.detach() + self.step_size * (gradient / gradient.norm(dim=-1, keepdim=True))
                    noise = torch.where(torch.isnan(noise), torch.zeros_like(noise), noise)
        return noise.detach()

    @torch.no_grad()
    def false_negatives(self, c1: torch.Tensor, c2: torch.Tensor, tau: float | None = None) -> torch.Tensor:
        """(N, N) bool: candidate j is a false negative of anchor i. `paper`: cos(c1_i, c2_j) > φ; `reference`:
        cos(c1_i, c2_j)/τ > 20·φ (the released code's threshold, τ the loss's). Strictly above; never on the
        diagonal (a sentence's own positive). Float32, autocast off."""
        with torch.autocast(device_type=c1.device.type, enabled=False):
            cos = normalize(c1.float()) @ normalize(c2.float()).T
            if self.convention == "reference":
                if tau is None:
                    raise ValueError("false_negatives: convention=reference compares cos/τ with 20·φ: give tau")
                flagged = cos / tau > REFERENCE_SCALE * self.phi
            else:
                flagged = cos > self.phi
        return flagged.fill_diagonal_(False)

    def reference_loss(
        self,
        z1: torch.Tensor,
        z2: torch.Tensor,
        noise: torch.Tensor | None,
        excluded: torch.Tensor,
        tau: float,
    ) -> LossOutput:
        """The released code's loss (spec §4): P = row-softmax([S | Sⁿ] ⊙ [W | 1]), W_ij = 0 for an excluded
        candidate (its logit becomes 0 and still adds e⁰ to the denominator), else 1; L = the mean over all
        N × (N + M) entries of −Y_ij log P_ij − (1 − Y_ij) log(1 − P_ij), Y = the identity (the positives).

        log P from a log-softmax and log(1 − P) as log1p(−P), each only where Y selects it: the same values up to
        rounding, without the released code's 0·log 0 = NaN where a probability rounds to 0 or 1 (the term's limit,
        0, there). Float32 (float64 stays float64), autocast off. Telemetry: the paradigm statistics over the
        negatives left (`excluded` removed)."""
        with torch.autocast(device_type=z1.device.type, enabled=False):
            h1, h2 = normalize(z1), normalize(z2)
            candidates = h2 if noise is None else torch.cat((h2, normalize(noise).to(h2.dtype)))
            s = h1 @ candidates.T
            if excluded.shape != s.shape:
                raise ValueError(f"reference_loss: excluded is {tuple(excluded.shape)}, the logits {tuple(s.shape)}")
            logits = s / tau * (~excluded).to(s.dtype)
            log_p = logits.log_softmax(dim=1)
            positive = torch.eye(*s.shape, dtype=torch.bool, device=s.device)
            log_not_p = torch.log1p(-log_p.exp().masked_fill(positive, 0.0))
            loss = -torch.where(positive, log_p, log_not_p).mean()

        def stats() -> dict[str, float]:
            return paradigm_stats(s, h1, candidates, excluded=excluded)

        return LossOutput(loss, LazyStats(stats, s.device))

    @torch.no_grad()
    def complementary_embeddings(
        self, batch: dict[str, torch.Tensor], chunk: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(c1, c2): the complementary model's embeddings of both training views (train mode, no gradient; in
        GradCache's chunks when it is on), every rank's gathered in rank order like the z's."""
        model = self.frozen.on(batch["input_ids"].device)  # dropout on, as the released code's complementary model
        if model is None:
            raise RuntimeError("DCLRNegatives.track(encoder) was not called")
        views = training_view_batches(batch)[:2]
        return tuple(gathered(in_chunks(model, view, chunk)) for view in views)


class TrainingRepresentation(nn.Module):
    """c = a sentemb encoder's training representation: its pooling and train-only MLP (`train_head=True`)."""

    def __init__(self, encoder: SentenceEncoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.encoder(rows, train_head=True)


class PoolerOutput(nn.Module):
    """c = a Hugging Face SimCSE model's pooler_output (SimCSE's trained MLP, the pooler of its HF conversion)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(**{key: value for key, value in rows.items() if key in BACKBONE_INPUTS}).pooler_output


def is_checkpoint_source(source: str) -> bool:
    """A sentemb checkpoint (a .ckpt name, or any file) rather than a Hugging Face folder or hub name."""
    return source.endswith(".ckpt") or Path(source).expanduser().is_file()


def check_complementary_source(source: str) -> None:
    """The complementary model's source is there (read without loading a model): `initial`, a readable sentemb
    checkpoint (its tensors left on disk), or a Hugging Face folder, cached or reachable hub name."""
    from sentemb.encoders.checkpoint import read_checkpoint

    if source == INITIAL:
        return
    if is_checkpoint_source(source):
        try:
            read_checkpoint(source, key=KEY, mmap=True)
        except SentembConfigError as err:  # a file is read as a checkpoint: say the other two sources too
            raise SentembConfigError(
                f"{str(err).rstrip('.')}. Or {KEY}=<a Hugging Face SimCSE model: a folder or hub name>, or "
                f"{KEY}=initial (a frozen copy of the encoder's initial weights)"
            ) from None
    else:
        check_simcse_source(source)


def check_simcse_source(source: str) -> None:
    """A Hugging Face folder, cached or reachable hub name (a backbone's checks), the offline fallback named."""
    from sentemb.encoders.models.backbones import check_model_source

    try:
        check_model_source(source, KEY)
    except SentembConfigError as err:
        raise SentembConfigError(
            f"{err} Or {KEY}=initial: a frozen copy of the encoder's initial weights, which needs nothing offline"
        ) from None


def build_complementary(source: str, encoder: SentenceEncoder) -> nn.Module:
    """The frozen complementary model `source` names (`initial`, a sentemb .ckpt, a Hugging Face SimCSE model), in
    train mode (its parameters leave any optimizer when held: `FrozenModel.hold`)."""
    if source == INITIAL:
        # the frozen weights are shared (they never change); the tokenizer is shared
        frozen = {id(p): p for p in encoder.parameters() if not p.requires_grad}
        model: nn.Module = TrainingRepresentation(
            copy.deepcopy(encoder, memo={id(encoder.tokenizer): encoder.tokenizer, **frozen})
        )
    elif is_checkpoint_source(source):
        from sentemb.encoders.build import load_checkpoint_encoder

        loaded, _ = load_checkpoint_encoder(source)
        check_vocabulary(loaded.tokenizer, encoder.tokenizer, source)
        model = TrainingRepresentation(loaded)
    else:
        model = PoolerOutput(pretrained_simcse(source, encoder))
    return model.train()


def pretrained_simcse(source: str, encoder: SentenceEncoder) -> nn.Module:
    """A Hugging Face SimCSE model with its pooler (the MLP it was trained with), its sources checked as a backbone's
    and its tokenizer's vocabulary against the run's; never its remote code."""
    from transformers import AutoModel

    from sentemb.encoders.models.backbones import NO_REMOTE_CODE, _offline_if_unreachable, pretrained_tokenizer
    from sentemb.encoders.models.model_files import transformers_refusals

    check_simcse_source(source)
    try:
        tokenizer = pretrained_tokenizer(source)
    except (OSError, ValueError) as err:
        raise SentembConfigError(
            f"{KEY}={source}: its tokenizer could not be read ({err}), so its vocabulary cannot be checked against "
            f"this run's. Fix: a SimCSE model folder with its tokenizer files, or {KEY}=initial"
        ) from None
    check_vocabulary(tokenizer, encoder.tokenizer, source)
    with transformers_refusals(source, KEY):
        return AutoModel.from_pretrained(
            source, add_pooling_layer=True, **NO_REMOTE_CODE, **_offline_if_unreachable(source)
        )


def check_vocabulary(theirs: Any, ours: Any, source: str) -> None:
    """The complementary model reads this run's token ids: its tokenizer's vocabulary must be the run's."""
    mine, other = ours.get_vocab(), theirs.get_vocab()
    if mine != other:
        differing = sorted(set(mine.items()) ^ set(other.items()))[:3]
        raise SentembConfigError(
            f"{KEY}={source}: its tokenizer's vocabulary ({len(other)} entries) is not this run's ({len(mine)}; "
            f"e.g. {differing}): it would read this run's token ids as other tokens. Fix: a complementary model "
            f"trained with this run's tokenizer (model.name_or_path), or {KEY}=initial"
        )
