"""HiCL: hierarchical contrastive learning over segments (Wu et al., EMNLP 2023 Findings).

Each tokenised sequence (special tokens stripped) is sliced into consecutive segments of
`slice_len` tokens, no overlap, the last one shorter (HiCL §3.1: l_i = 1 + ⌊(|seq_i| − 1)/L⌋);
each segment is re-wrapped in the tokenizer's special tokens (or in the prompt template with
`prompt: true`), all segments of a batch are encoded as one flattened batch, and a sequence's
embedding is the average of its segments' embeddings weighted by their token counts
(`weighting: uniform` for the unweighted variant of §5.1). Evaluation embeds whole sentences the
same way. Training adds the local loss (Eq. 2): InfoNCE over segments whose negatives are
the other view's segments of *other* sequences only (same-sequence segments are neither positive
nor negative; `local_negatives: averaging` weights each negative by 1/v_k, v_k the number of
segments of its sequence, App. A.8); with `entailment_beta > 0` HiCLv2's sequence–segment
entailment loss (App. A.6, Eq. 3). Total (§3.2, A.6): α·L_local + β·L_entail + (1−α−β)·L_global,
L_global being the configured `loss=` on sequence embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from sentemb.encoders.pooling import CLSPooling, Pooling, PromptPooling, TrainingViews
from sentemb.encoders.prompt import PROMPTBERT_TEMPLATE, TokenTemplate, model_max_length, rebatch
from sentemb.errors import SentembConfigError


@dataclass(frozen=True)
class Segments:
    """Which sequence each segment belongs to, and its weight in that sequence's average."""

    owner: torch.Tensor  # (S,) sequence index of each segment
    weight: torch.Tensor  # (S,) sums to 1 over each sequence's segments
    count: torch.Tensor  # (B,) segments per sequence


def slice_content(content: list[int], slice_len: int) -> list[list[int]]:
    """Consecutive, non-overlapping slices of `slice_len` tokens; the last may be shorter; ≥ 1 slice."""
    if not content:
        return [[]]
    return [content[start : start + slice_len] for start in range(0, len(content), slice_len)]


def segment_weights(lengths: list[int], owner: list[int], weighting: str) -> list[float]:
    """w_ij = |seg_ij| / Σ_k |seg_ik| (HiCL §3.1), or 1 / l_i with weighting=uniform."""
    totals: dict[int, float] = {}
    for length, seq in zip(lengths, owner, strict=True):
        totals[seq] = totals.get(seq, 0.0) + (max(length, 1) if weighting == "length" else 1.0)
    return [
        (max(length, 1) if weighting == "length" else 1.0) / totals[seq]
        for length, seq in zip(lengths, owner, strict=True)
    ]


class HiCLPooling(Pooling):
    def __init__(
        self,
        hidden_size: int,
        slice_len: int = 32,
        weighting: str = "length",
        alpha: float = 0.05,
        local_tau: float = 0.05,
        local_negatives: str = "summation",
        entailment_beta: float = 0.0,
        prompt: bool = False,
        template: str = PROMPTBERT_TEMPLATE,
        mlp: str = "train",
        train_max_length: int = 512,
    ) -> None:
        super().__init__()
        if not (isinstance(slice_len, int) and slice_len >= 1):
            raise SentembConfigError(f"pooling.slice_len={slice_len} must be an integer >= 1 (HiCL: 32)")
        if weighting not in ("length", "uniform"):
            raise SentembConfigError(f"pooling.weighting={weighting!r}: use length (HiCL) or uniform")
        if local_negatives not in ("summation", "averaging"):
            raise SentembConfigError(f"pooling.local_negatives={local_negatives!r}: use summation (HiCL) or averaging")
        if not (0 <= alpha and 0 <= entailment_beta and alpha + entailment_beta <= 1):
            raise SentembConfigError(
                f"pooling.alpha={alpha}, pooling.entailment_beta={entailment_beta}: need α, β ≥ 0 and α + β ≤ 1 "
                "(the global loss gets 1 − α − β). Fix: e.g. pooling.alpha=0.05"
            )
        if not local_tau > 0:
            raise SentembConfigError(f"pooling.local_tau={local_tau} must be > 0, e.g. 0.05")
        self.slice_len, self.weighting = slice_len, weighting
        self.alpha, self.local_tau, self.local_negatives, self.entailment_beta = (
            alpha,
            local_tau,
            local_negatives,
            entailment_beta,
        )
        self.train_max_length = train_max_length  # read by conf/data (data.max_length), kept for the record
        self.segment_pooling = PromptPooling(hidden_size, template, mlp) if prompt else CLSPooling(hidden_size, mlp)
        self._segments: Segments | None = None

    def with_head(self, head: Pooling) -> Pooling:
        """A head (SARCSE) makes each segment's vector; the segments are still aggregated."""
        self.segment_pooling = head
        return self

    def prepare_training(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.segment_pooling.prepare_training(tokenizer)

    # ------------------------------------------------------------------ slicing (token level)
    def prepare(self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
        """Token batch of B sequences → token batch of S segments; remembers owners and weights."""
        if isinstance(self.segment_pooling, PromptPooling):
            template = self.segment_pooling.token_template(tokenizer)
        else:
            template = TokenTemplate.plain(tokenizer)
        limit = model_max_length(tokenizer)
        rows, owner, lengths = [], [], []
        for index, (ids, keep) in enumerate(
            zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(), strict=True)
        ):
            for piece in slice_content(
                template.content([i for i, k in zip(ids, keep, strict=True) if k]), self.slice_len
            ):
                rows.append(template.wrap(piece, limit))
                owner.append(index)
                lengths.append(len(piece))
        device = batch["input_ids"].device
        weights = segment_weights(lengths, owner, self.weighting)
        owner_tensor = torch.tensor(owner, device=device)
        self._segments = Segments(
            owner_tensor,
            torch.tensor(weights, device=device),
            torch.bincount(owner_tensor, minlength=batch["input_ids"].shape[0]),
        )
        return rebatch(rows, batch, tokenizer.pad_token_id)

    def segment_embeddings(
        self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool
    ) -> torch.Tensor:
        return self.segment_pooling(
            hidden, batch["attention_mask"], train_head=train_head, input_ids=batch["input_ids"]
        )

    def aggregate(self, segments: torch.Tensor) -> torch.Tensor:
        """Σ_j w_ij h_ij for every sequence i (HiCL §3.1)."""
        info = self._segments
        out = torch.zeros(len(info.count), segments.shape[1], dtype=segments.dtype, device=segments.device)
        return out.index_add(0, info.owner, segments * info.weight[:, None].to(segments.dtype))

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, train_head: bool = False, input_ids=None
    ) -> torch.Tensor:
        batch = {"attention_mask": attention_mask, "input_ids": input_ids}
        return self.aggregate(self.segment_embeddings(hidden, batch, train_head))

    # ------------------------------------------------------------------ training objectives
    def training_rows(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The rows are segments: their embeddings (and, with head=sarcse, each segment's reconstruction loss)."""
        return self.segment_pooling.training_rows(hidden, batch)

    def training_views(self, rows: dict[str, torch.Tensor], n: int) -> TrainingViews:
        """Sequence embeddings of both views, plus the local (and entailment) loss over their segments."""
        segments = rows["embedding"]
        sequences = self.aggregate(segments)
        half = segments.shape[0] // 2  # the doubled batch slices identically: first half is view 1
        global_weight = 1.0 - self.alpha - self.entailment_beta
        auxiliary = {"local": (self.alpha, self.local_loss(segments, half))}
        if self.entailment_beta > 0:
            auxiliary["entailment"] = (self.entailment_beta, self.entailment_loss(segments, sequences, half))
        if "reconstruction" in rows:  # SARCSE on every segment: Eq. 10's α scales the contrastive part
            auxiliary.update(self.segment_pooling.reconstruction_terms(rows["reconstruction"], half))
            global_weight *= self.segment_pooling.alpha
        return TrainingViews(sequences[:n], sequences[n:], global_weight, auxiliary)

    def local_loss(self, segments: torch.Tensor, half: int) -> torch.Tensor:
        """Eq. 2 over the two views' segments; same-sequence segments other than the positive are masked out."""
        info = self._segments
        s = half  # segments per view: the doubled batch repeats the first view's rows
        owner, count = info.owner[:s], info.count[: len(info.count) // 2]
        with torch.autocast(device_type=segments.device.type, enabled=False):
            h1, h2 = F.normalize(segments[:s].float(), dim=-1), F.normalize(segments[s:].float(), dim=-1)
            logits = h1 @ h2.T / self.local_tau
        same_sequence = owner[:, None] == owner[None, :]
        positive = torch.eye(s, dtype=torch.bool, device=logits.device)
        logits = logits.masked_fill(same_sequence & ~positive, float("-inf"))
        if self.local_negatives == "averaging":  # w_k = 1/v_k on negatives (App. A.8)
            logits = logits - torch.where(positive, 0.0, count[owner].float().log()[None, :])
        return F.cross_entropy(logits, torch.arange(s, device=logits.device))

    def entailment_loss(self, segments: torch.Tensor, sequences: torch.Tensor, half: int) -> torch.Tensor:
        """HiCLv2 (App. A.6, Eq. 3): a segment against its own sequence (the other view) vs the other sequences."""
        info = self._segments
        with torch.autocast(device_type=segments.device.type, enabled=False):
            seg = F.normalize(segments[:half].float(), dim=-1)
            seq = F.normalize(sequences[len(info.count) // 2 :].float(), dim=-1)
            logits = seg @ seq.T / self.local_tau
        return F.cross_entropy(logits, info.owner[:half])
