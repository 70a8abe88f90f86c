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

`prepare` returns the segment batch with each segment's `segment_owner` (the index of its
sequence) and `segment_weight` (its weight in that sequence's average); aggregation and the
local losses read them from that batch, so the pooling keeps no state between calls. The
training length follows conf/pooling/hicl.yaml's `data.max_length` (512: long inputs are cheap
once sliced).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from sentemb.common.batch_views import training_view_batches
from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import POSITIVE, Bounds, require_number
from sentemb.common.parts import ENCODERS, part
from sentemb.encoders.poolings.base import Pooling, TrainingViews, refuse_head, split_views
from sentemb.encoders.poolings.encoder_poolings import CLSPooling, PromptPooling
from sentemb.encoders.poolings.templates import (
    PROMPTBERT_TEMPLATE,
    TokenTemplate,
    check_template,
    model_max_length,
    real_ids,
    rebatch,
)


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


@part("pooling", "hicl", serves=ENCODERS, why_not="its segments are pooled at [CLS] or [MASK]")
class HiCLPooling(Pooling):
    term_labels = ("local", "entailment")  # α·L_local, and β·L_entailment where β > 0
    graph_refusal = (
        "format=onnx with pooling=hicl: HiCL splits every sentence into segments before the encoder and weights the "
        "segments' vectors by their lengths, so one sentence is several graph rows and one ONNX graph cannot embed it. "
        "Fix: export without format=onnx (a sentence-transformers folder)"
    )

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
        positive_template: str | None = None,
    ) -> None:
        super().__init__()
        if not (isinstance(slice_len, int) and slice_len >= 1):
            raise SentembConfigError(f"pooling.slice_len={slice_len} must be an integer >= 1 (HiCL: 32)")
        if weighting not in ("length", "uniform"):
            raise SentembConfigError(f"pooling.weighting={weighting!r}: use length (HiCL) or uniform")
        if local_negatives not in ("summation", "averaging"):
            raise SentembConfigError(f"pooling.local_negatives={local_negatives!r}: use summation (HiCL) or averaging")
        require_number("pooling.alpha", alpha, Bounds(0.0, 1.0), "e.g. pooling.alpha=0.05")
        require_number("pooling.entailment_beta", entailment_beta, Bounds(0.0, 1.0), "e.g. pooling.entailment_beta=0")
        if alpha + entailment_beta > 1:
            raise SentembConfigError(
                f"pooling.alpha={alpha}, pooling.entailment_beta={entailment_beta}: need α, β ≥ 0 and α + β ≤ 1 "
                "(the global loss gets 1 − α − β). Fix: e.g. pooling.alpha=0.05"
            )
        require_number("pooling.local_tau", local_tau, POSITIVE, "e.g. pooling.local_tau=0.05")
        check_template(template)
        self.slice_len, self.weighting = slice_len, weighting
        self.alpha, self.local_tau, self.local_negatives, self.entailment_beta = (
            alpha,
            local_tau,
            local_negatives,
            entailment_beta,
        )
        self.segment_pooling = (
            PromptPooling(hidden_size, template, mlp, positive_template=positive_template)
            if prompt
            else CLSPooling(hidden_size, mlp)
        )

    def with_head(self, head: Pooling) -> Pooling:
        """A head (SARCSE) makes each segment's vector; the segments are still aggregated."""
        if isinstance(self.segment_pooling, PromptPooling):
            refuse_head("pooling.prompt=true", head)
        self.segment_pooling = head
        return self

    def prepare_training(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.segment_pooling.prepare_training(tokenizer)

    # ------------------------------------------------------------------ slicing (token level)
    def prepare(self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase) -> dict[str, torch.Tensor]:
        """Token batch of B sequences → token batch of S segments, with their owners and weights."""
        return self.segment_batch([batch], tokenizer)

    def training_batch(
        self, batch: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        """Every training view sliced the same way (HiCL §3.1: "we also apply the same method to the negated
        sentences"); with the prompt, the anchor's segments in its template and the other views' in the positive
        template. Owners count on across views: view v's sequence i is owner v·B + i."""
        return self.segment_batch(training_view_batches(batch), tokenizer)

    def segment_batch(
        self, views: list[dict[str, torch.Tensor]], tokenizer: PreTrainedTokenizerBase
    ) -> dict[str, torch.Tensor]:
        prompt = isinstance(self.segment_pooling, PromptPooling)
        limit = model_max_length(tokenizer)
        rows, owner, lengths = [], [], []
        sequence = -1
        for number, view in enumerate(views):
            template = self.view_template(tokenizer, prompt, later=number > 0)
            for ids in real_ids(view):
                sequence += 1
                for piece in slice_content(template.content(ids), self.slice_len):
                    rows.append(template.wrap(piece, limit))
                    owner.append(sequence)
                    lengths.append(len(piece))
        segments = rebatch(rows, views[0], tokenizer.pad_token_id, tokenizer.mask_token_id if prompt else None)
        device = views[0]["input_ids"].device
        segments["segment_owner"] = torch.tensor(owner, device=device)
        segments["segment_weight"] = torch.tensor(segment_weights(lengths, owner, self.weighting), device=device)
        return segments

    def view_template(self, tokenizer: PreTrainedTokenizerBase, prompt: bool, later: bool) -> TokenTemplate:
        """The anchor's template, or for a later view the segment pooling's positive template (plain: none)."""
        if not prompt:
            return TokenTemplate.plain(tokenizer)
        text = self.segment_pooling.template
        if later and self.segment_pooling.positive_template:
            text = self.segment_pooling.positive_template
        return TokenTemplate.build(tokenizer, text)

    def aggregate(self, segments: torch.Tensor, batch: dict[str, torch.Tensor], sequences: int) -> torch.Tensor:
        """Σ_j w_ij h_ij for every sequence i (HiCL §3.1)."""
        owner, weight = batch["segment_owner"], batch["segment_weight"]
        out = torch.zeros(sequences, segments.shape[1], dtype=segments.dtype, device=segments.device)
        return out.index_add(0, owner, segments * weight[:, None].to(segments.dtype))

    def forward(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor], train_head: bool = False) -> torch.Tensor:
        sequences = int(batch["segment_owner"][-1]) + 1  # owners ascend and every sequence has a segment
        return self.aggregate(self.segment_pooling(hidden, batch, train_head=train_head), batch, sequences)

    # ------------------------------------------------------------------ training objectives
    def training_rows(self, hidden: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The rows are segments: their embeddings (and, with head=sarcse, each segment's reconstruction loss)."""
        return self.segment_pooling.training_rows(hidden, batch)

    def own_term_labels(self) -> set[str]:
        return set(self.term_labels) | self.segment_pooling.own_term_labels()

    def training_views(self, rows: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], n: int) -> TrainingViews:
        """Sequence embeddings of every view, plus the local (and entailment) loss over their segments."""
        segments = rows["embedding"]
        owner = batch["segment_owner"]
        views = (int(owner[-1]) + 1) // n  # every view the batch carries (2: the anchor and its positive)
        sequences = self.aggregate(segments, batch, views * n)
        embeddings = split_views(sequences, n)
        anchors = int((owner < n).sum())  # view 1's segments come first
        global_weight = 1.0 - self.alpha - self.entailment_beta
        auxiliary = {"local": (self.alpha, self.local_loss(segments, owner, n))}
        if self.entailment_beta > 0:
            auxiliary["entailment"] = (self.entailment_beta, self.entailment_loss(segments, embeddings[1], owner, n))
        # a head on every segment (SARCSE): its per-segment terms, and Eq. 10's α on the contrastive part
        auxiliary.update(self.segment_pooling.own_terms(rows, anchors))
        global_weight *= self.segment_pooling.contrastive_weight
        return TrainingViews(embeddings, global_weight, auxiliary)

    def local_loss(self, segments: torch.Tensor, owner: torch.Tensor, n: int) -> torch.Tensor:
        """Eq. 2: each anchor segment against the positive view's segments; same-sequence segments other than the
        positive are masked out.

        Segment j of sequence i (view 1) is paired with segment j of sequence i in view 2. The views slice alike
        unless view 2 is longer (ESimCSE's repeated tokens): its extra segments are candidates only (negatives of the
        other sequences), and an anchor segment without a counterpart sits out the local loss.
        """
        first = owner < n
        second = (owner >= n) & (owner < 2 * n)
        anchor_owner, candidate_owner = owner[first], owner[second] - n
        anchor_index, candidate_index = position_in_sequence(anchor_owner), position_in_sequence(candidate_owner)
        # the counterpart of anchor (i, j): the candidate with owner i and position j, found among sorted keys
        width = int(max(anchor_index.max(), candidate_index.max())) + 1
        anchor_key, candidate_key = anchor_owner * width + anchor_index, candidate_owner * width + candidate_index
        target = torch.searchsorted(candidate_key, anchor_key).clamp(max=len(candidate_key) - 1)
        paired = candidate_key[target] == anchor_key
        with torch.autocast(device_type=segments.device.type, enabled=False):
            h1 = F.normalize(segments[first][paired].float(), dim=-1)
            h2 = F.normalize(segments[second].float(), dim=-1)
            logits = h1 @ h2.T / self.local_tau
        target = target[paired]
        positive = torch.zeros_like(logits, dtype=torch.bool)
        positive[torch.arange(len(target), device=logits.device), target] = True
        same_sequence = anchor_owner[paired][:, None] == candidate_owner[None, :]
        logits = logits.masked_fill(same_sequence & ~positive, float("-inf"))
        if self.local_negatives == "averaging":  # w_k = 1/v_k on negatives (App. A.8), v_k counted in view 2
            count = torch.bincount(candidate_owner, minlength=n)
            logits = logits - torch.where(positive, 0.0, count[candidate_owner].float().log()[None, :])
        return F.cross_entropy(logits, target)

    def entailment_loss(
        self, segments: torch.Tensor, positives: torch.Tensor, owner: torch.Tensor, n: int
    ) -> torch.Tensor:
        """HiCLv2 (App. A.6, Eq. 3): a segment against its own sequence (the other view) vs the other sequences."""
        first = owner < n
        with torch.autocast(device_type=segments.device.type, enabled=False):
            seg = F.normalize(segments[first].float(), dim=-1)
            seq = F.normalize(positives.float(), dim=-1)
            logits = seg @ seq.T / self.local_tau
        return F.cross_entropy(logits, owner[first])


def position_in_sequence(owner: torch.Tensor) -> torch.Tensor:
    """Each segment's position j within its sequence, for owners in ascending order (segments are contiguous)."""
    index = torch.arange(len(owner), device=owner.device)
    starts = torch.ones_like(owner, dtype=torch.bool)
    starts[1:] = owner[1:] != owner[:-1]
    first = torch.cummax(torch.where(starts, index, 0), dim=0).values
    return index - first
