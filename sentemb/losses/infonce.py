"""InfoNCE, the loss of unsupervised SimCSE.

    L_i = −log e^{s_ii/τ} / Σ_j e^{s_ij/τ}          (paradigm paper Eq. 1; SimCSE Eq. 1)

Inputs: z1, z2 of shape (N, D), the two dropout views of the same N sentences; the other
N−1 sentences of the batch are the negatives. Reference: Gao et al., SimCSE (EMNLP 2021).
Example: `InfoNCE(temperature=0.05)(z1, z2).loss`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sentemb.errors import SentembConfigError
from sentemb.losses.base import LossOutput, Objective, cross_view_similarity


class InfoNCE(Objective):
    def __init__(self, temperature: float = 0.05, symmetric: bool = False) -> None:
        super().__init__()
        if not temperature > 0:
            raise SentembConfigError(
                f"loss.temperature={temperature} must be > 0 (τ divides the cosine). Fix: e.g. loss.temperature=0.05"
            )
        self.temperature = temperature
        self.symmetric = symmetric

    def forward(self, z1: torch.Tensor, z2: torch.Tensor) -> LossOutput:
        sim = cross_view_similarity(z1, z2)
        labels = torch.arange(sim.shape[0], device=sim.device)
        loss = F.cross_entropy(sim / self.temperature, labels)
        if self.symmetric:  # average both directions: h anchors vs h' candidates and h' vs h
            loss = 0.5 * (loss + F.cross_entropy(sim.T / self.temperature, labels))
        return LossOutput(loss, batch_similarity_stats(sim.detach()))


def batch_similarity_stats(sim: torch.Tensor) -> dict[str, float]:
    """Mean anchor–positive and anchor–negative cosine of an (N, N) cross-view similarity."""
    n = sim.shape[0]
    positive = sim.diagonal()
    off_diagonal = ~torch.eye(n, dtype=torch.bool, device=sim.device)
    stats = {"cos_pos": positive.mean().item()}
    if n > 1:
        stats["cos_neg"] = sim[off_diagonal].mean().item()
    return stats
