"""The paradigm's shared pieces, so that each loss reads like its equation.

All functions take unit vectors / cosine matrices already in float32 (or float64) and are
safe at cos = ±1 and for duplicated sentences: arccos and sqrt see clamped arguments.
Notation of docs/objectives.md: s_ij = h_i·h'_j (cross view), a_ij = h_i·h_j
(same view), d_i the margin indicator, W the weight of a negative, R the ratio.
A cross-view matrix may be rectangular, N×M with M = N + K: its first N columns are the batch
(positive on the diagonal) and the last K extra negatives (a momentum queue); the helpers below
that take one treat every column but the diagonal's as a negative.

False negatives (DCLR's exclusion, `Objective.forward(..., excluded=)`): the helpers that read a row's
negatives take `excluded`, an N×M bool mask (never True on the diagonal) of the columns that are not
negatives of that row; they then read only the other columns. A row whose negatives are all excluded
has none: its max is −inf, its log-sum-exp −inf, its weights 0 (never NaN). Without it (None) each
helper computes exactly what it did before.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

EPS = 1e-6  # clamp for arccos / sqrt: keeps gradients finite at cos = ±1 (spec: numerics)
POWER_FLOOR = 1e-4  # the public code's clamp_min(similarity, 1e-4) before a power weight


def diagonal_mask(n: int, device: torch.device, columns: int | None = None) -> torch.Tensor:
    """True on the diagonal (the positive pair / the anchor itself), n × `columns` (default n: square)."""
    return torch.eye(n, n if columns is None else columns, dtype=torch.bool, device=device)


def positive_mask(matrix: torch.Tensor) -> torch.Tensor:
    """True at (i, i) of an N×M matrix (M ≥ N): each row's positive; every other entry is a negative."""
    return diagonal_mask(matrix.shape[0], matrix.device, matrix.shape[1])


def not_negative(matrix: torch.Tensor, excluded: torch.Tensor | None = None) -> torch.Tensor:
    """True where (i, j) is no negative of row i: the diagonal (its positive), and the `excluded` false negatives."""
    mask = positive_mask(matrix)
    return mask if excluded is None else mask | excluded


def has_negative(matrix: torch.Tensor, excluded: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) True for the rows with at least one negative left (all True without `excluded`, for M ≥ 2)."""
    return (~not_negative(matrix, excluded)).any(dim=1)


def hardest_negative(sim: torch.Tensor, excluded: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """max_{j≠i} sim_ij and its index j for every row i (over all M columns but the `excluded`: −inf where none)."""
    masked = sim.masked_fill(not_negative(sim, excluded), -math.inf)
    return masked.max(dim=1)


def negatives_logsumexp(logits: torch.Tensor, excluded: torch.Tensor | None = None) -> torch.Tensor:
    """log Σ_{j≠i} e^{logits_ij} for every row i (j not `excluded`; −inf where none is left)."""
    return logits.masked_fill(not_negative(logits, excluded), -math.inf).logsumexp(dim=1)


def negative_softmax(logits: torch.Tensor, excluded: torch.Tensor | None = None) -> torch.Tensor:
    """e^{logits_ij} / Σ_{k≠i} e^{logits_ik}, zero on the diagonal (the exponential W of Table 1); with `excluded`
    zero there too and the sum over the other negatives (a row with none left: all zero)."""
    weights = logits.masked_fill(not_negative(logits, excluded), -math.inf).softmax(dim=1)
    return weights if excluded is None else weights.nan_to_num(nan=0.0)  # softmax of an all −inf row: NaN


def global_negative_softmax(logits: torch.Tensor) -> torch.Tensor:
    """e^{logits_ij} / Σ_{k≠l} e^{logits_kl}: one normalisation over every ordered pair (mB, mV weights)."""
    masked = logits.masked_fill(positive_mask(logits), -math.inf)
    return (masked - masked.flatten().logsumexp(dim=0)).exp()


def power_weights(similarity: torch.Tensor, power: float) -> torch.Tensor:
    """max(similarity, 1e-4)^power, diagonal kept: the public code's power weights (power 0: all ones)."""
    if power == 0:
        return torch.ones_like(similarity)
    return similarity.clamp_min(POWER_FLOOR).pow(power)


def negative_power_weights(
    similarity: torch.Tensor,
    power: float,
    *,
    normalise: Literal["row", "global"] = "row",
    excluded: torch.Tensor | None = None,
) -> torch.Tensor:
    """max(s_ij, 1e-4)^power, zero on the diagonal, divided by its row sums (`row`: Σ_{k≠i}) or its
    total (`global`: Σ_{k≠l}): the public code's power W, normalised (power 0: uniform). `excluded`: zero there
    too, left out of the sums (a row with no negative left: all zero)."""
    if normalise not in ("row", "global"):
        raise ValueError(f"normalise={normalise!r} must be 'row' or 'global'")
    weights = power_weights(similarity, power).masked_fill(not_negative(similarity, excluded), 0.0)
    total = weights.sum(dim=1, keepdim=True) if normalise == "row" else weights.sum()
    if excluded is not None:  # an empty row's (or batch's) 0 / 0
        total = total.clamp_min(torch.finfo(weights.dtype).tiny)
    return weights / total


def upper_pairs(matrix: torch.Tensor) -> torch.Tensor:
    """The entries k < l of a square matrix, flattened (the Σ_{k<l} of MHE)."""
    rows, cols = torch.triu_indices(matrix.shape[0], matrix.shape[1], offset=1, device=matrix.device)
    return matrix[rows, cols]


def margin_indicator(s: torch.Tensor, m: float, excluded: torch.Tensor | None = None) -> torch.Tensor:
    """d_i = 𝕀{s_ii − max_{k≠i} s_ik < m} (the margin GD; k over all M columns but the `excluded`: 0 where none is
    left), detached, as a 0/1 float."""
    with torch.no_grad():
        return (s.diagonal() - hardest_negative(s, excluded)[0] < m).to(s.dtype)


def same_view_margin_indicator(a: torch.Tensor, m: float) -> torch.Tensor:
    """d_i = 𝕀{1 − max_{j≠i} a_ij < m}: the paper's reference code reads the margin off the same view."""
    with torch.no_grad():
        return (1.0 - hardest_negative(a)[0] < m).to(a.dtype)


def gate_anchors(h: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """h_i where d_i = 1, sg(h_i) elsewhere: the anchor gets gradient only where GD is active."""
    return torch.where(d.bool()[:, None], h, h.detach())


def safe_arccos(cos: torch.Tensor) -> torch.Tensor:
    """θ = arccos(cos) with cos clamped into (−1+ε, 1−ε) so dθ/dcos stays finite."""
    return torch.arccos(cos.clamp(-1.0 + EPS, 1.0 - EPS))


def unit_distance(cos: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """‖a − b‖ of unit vectors as sqrt(clamp(2 − 2cos, ε)): finite gradient at cos = 1."""
    return torch.sqrt((2.0 - 2.0 * cos).clamp_min(eps))


def one_hot_rows(index: torch.Tensor, n: int, dtype: torch.dtype, rows: torch.Tensor | None = None) -> torch.Tensor:
    """W of MPT/MET/MHS: 1 for each row's chosen (hardest) negative, 0 elsewhere, over n columns (M with a queue);
    `rows` (N,) bool: only those rows have one (a row with every negative excluded: all zero)."""
    weights = torch.nn.functional.one_hot(index, n).to(dtype)
    return weights if rows is None else weights * rows[:, None].to(dtype)


# the telemetry `paradigm_stats` reports (Figures 7–9): of every loss it serves; of those with a weight W and ratio
PARADIGM_TELEMETRY = (
    "gd",
    "mu_pos",
    "mu_neg",
    "sigma_pos",
    "sigma_neg",
    "cos_pos",
    "cos_neg",
    "alignment",
    "uniformity",
)
WEIGHTED_TELEMETRY = (*PARADIGM_TELEMETRY, "hardest_share", "ratio")


@torch.no_grad()
def paradigm_stats(
    s: torch.Tensor,
    h1: torch.Tensor,
    h2: torch.Tensor,
    gd: torch.Tensor | float | None = None,
    weights: torch.Tensor | None = None,
    ratio: torch.Tensor | float | None = None,
    excluded: torch.Tensor | None = None,
) -> dict[str, float]:
    """The telemetry of Figures 7–9 for one batch, as floats (one host transfer).

    gd: per-anchor GD (mean logged as `gd`: the fraction of active anchors for indicators);
    weights: (N, M) non-negative W, zero diagonal (`hardest_share`: mean over anchors of the
    largest W over ΣW, the hardest negative's share since every W here grows with similarity);
    ratio: per anchor (N,) or per pair (N, M), the latter averaged with W as weights (`ratio`).
    Always: cosine and angle statistics of positives and negatives (s may be N×M, M = N + K with extra
    negatives: every off-diagonal column is a negative), batch alignment and uniformity (of the
    batch's N sentences; uniformity needs two). `excluded` (N×M bool, DCLR's false negatives): the
    negatives' statistics read the other columns only (left out when none is left), and a per-anchor
    ratio is averaged over the anchors with a negative left.
    """
    n = s.shape[0]
    off = ~not_negative(s, excluded)
    theta = safe_arccos(s)
    theta_pos, theta_neg = theta.diagonal(), theta[off]
    negatives = theta_neg.numel() > 0  # none left when every negative is excluded: no statistics (not NaN)
    values = {
        "cos_pos": s.diagonal().mean(),
        "cos_neg": s[off].mean() if negatives else None,
        "mu_pos": theta_pos.mean(),
        "mu_neg": theta_neg.mean() if negatives else None,
        "sigma_pos": theta_pos.std(unbiased=False),
        "sigma_neg": theta_neg.std(unbiased=False) if negatives else None,
        # Wang & Isola (2020), α = 2 and t = 2: E‖h−h'‖², log E e^{−2‖h_i−h_j‖²}
        "alignment": (h1 - h2[:n]).pow(2).sum(dim=1).mean(),  # h2[:n]: the views, not the extra negatives
    }
    values = {name: value for name, value in values.items() if value is not None}
    if n >= 2:  # a batch of one (with a queue) has no pair
        values["uniformity"] = upper_pairs(-2.0 * (2.0 - 2.0 * (h1 @ h1.T))).logsumexp(dim=0) - math.log(
            n * (n - 1) / 2
        )
    if gd is not None:
        values["gd"] = torch.as_tensor(gd, dtype=s.dtype, device=s.device).mean()
    if weights is not None:
        total = weights.sum(dim=1)
        has_weight = total > 0
        if has_weight.any():
            values["hardest_share"] = (weights.max(dim=1).values[has_weight] / total[has_weight]).mean()
    if ratio is not None:
        ratio = torch.as_tensor(ratio, dtype=s.dtype, device=s.device)
        if ratio.dim() == 2 and weights is not None:
            ratio = (weights * ratio).sum(dim=1) / weights.sum(dim=1).clamp_min(torch.finfo(s.dtype).tiny)
        if excluded is not None and ratio.dim() == 1:  # anchors with no negative left have no ratio
            ratio = ratio[has_negative(s, excluded)]
        if ratio.numel():
            values["ratio"] = ratio.mean()
    names = list(values)
    numbers = torch.stack([values[name].to(s.dtype) for name in names]).tolist()
    return dict(zip(names, numbers, strict=True))
