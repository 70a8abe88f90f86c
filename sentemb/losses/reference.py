"""The paradigm paper's public code, branch by branch: what `loss.convention=reference` computes.

Source: BDBC-KG-NLP/UnderstandingCSE, isotropy/models.py, `InitAndForward._i_forward`, run by
scripts/application/{bert,roberta}/*.sh and scripts/empirical/*.sh. The code picks a branch
by the tokens of `loss_fn_settings` (`sg`, `mhe`, `mhs`, `vicreg`, `barlowtwins`) and switches
its parts on with the flags `w_gd` (gradient dissipation), `w_w` (weights) and `w_r` (ratio);
`loss_param_settings` gives m, temp, ratio, lambda, power. Here the flags are keyword arguments
(`gd`, `weights`, `ratio`: None without `w_r`) and the parameters keep sentemb's names
(temp → tau, lambda → nu). h1 is the code's `embeds_0_norm`, h2 its `embeds_1_norm`.

What the code does that the paper's text does not (each function says where):
- both directions are summed, each view gated by its own same-view margin indicator
  d_i = 𝕀{a_ii − max_{j≠i} a_ij < m}, applied to that view's embedding wherever it appears;
- the `sg` loss keeps the positive h_i·h'_i live in both views and averages over active rows;
- MHE on e^{h_k·h_l} = e^{1 − ‖h_k−h_l‖²/2} (half the text's exponent in align+MHE), without
  the 2/(N(N−1)) normaliser; MHS cross-view and detached with sqrt(‖·‖² + 1e-4);
- VICReg and Barlow Twins as the gradient surrogates of Table 2, not the objectives.

Finite values: the code's `sg` loss takes the mean of an empty selection when no row passes
the margin (NaN); here that direction is 0 with zero gradient. Everything else is computed as
the code does, up to rounding: exponential weights are normalised in the log domain (no
overflow for small τ) and MHS's squared distances are expanded (N² memory instead of N²·D).
"""

from __future__ import annotations

import math

import torch

from sentemb.losses.base import LazyStats, LossOutput
from sentemb.losses.geometry import (
    diagonal_mask,
    gate_anchors,
    margin_indicator,
    negative_power_weights,
    negatives_logsumexp,
    paradigm_stats,
    power_weights,
)

MHS_EPS = 1e-4  # the code's sqrt(‖h_i − h'_j‖² + 1e-4)


def with_telemetry(
    loss: torch.Tensor, parts: dict[str, torch.Tensor], h1: torch.Tensor, h2: torch.Tensor
) -> LossOutput:
    """The loss and the paradigm telemetry (computed when read): GD of the h anchors (d1), W and R where the branch
    defines them."""

    def stats() -> dict[str, float]:
        return paradigm_stats(h1 @ h2.T, h1, h2, gd=parts["d1"], weights=parts.get("weights"), ratio=parts.get("ratio"))

    return LossOutput(loss, LazyStats(stats, h1.device))


def gated_views(
    h1: torch.Tensor, h2: torch.Tensor, *, gd: bool, m: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(g1, g2, d1, d2): each view gated by its own indicator (w_gd), or unchanged with indicators 1.

    The code's w_gd mask on one view: d_i = 𝕀{a_ii − max_{j≠i} a_ij < m}, a = h hᵀ with a_ii as
    computed (≈ 1); gated, h_i where d_i = 1 and sg(h_i) elsewhere (`h * mask + h.detach() * ~mask`).
    """
    if not gd:
        ones = torch.ones(h1.shape[0], dtype=h1.dtype, device=h1.device)
        return h1, h2, ones, ones
    with torch.no_grad():  # the indicators only select; no graph for the Gram matrices
        d1, d2 = margin_indicator(h1 @ h1.T, m), margin_indicator(h2 @ h2.T, m)
    return gate_anchors(h1, d1), gate_anchors(h2, d2), d1, d2


def lower_pairs(matrix: torch.Tensor) -> torch.Tensor:
    """The entries k > l, flattened: the code's `matrix[triu(ones) == 0]`."""
    rows, cols = torch.tril_indices(matrix.shape[0], matrix.shape[1], offset=-1, device=matrix.device)
    return matrix[rows, cols]


def sg_loss(
    h1: torch.Tensor,
    h2: torch.Tensor,
    *,
    gd: bool,
    weights: str,
    m: float,
    tau: float,
    r: float,
    power: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The `sg` branch (`sg[.w_gd]`, the paradigm loss of Eq. 5): both directions summed.

    In words: d1_i = 𝕀{s_ii − max_{j≠i} s_ij < m} over rows and d2_j the same over columns (the
    h' anchors' cross-view margin). The positive p_i = h_i·h'_i is computed once, live in both
    views. Direction h → h': rows h_i·sg(h'_j) with the diagonal replaced by p_i, target
    t_ij = sim_ij − r·p_i, weight from the detached rows: softmax of sim/τ off the diagonal, or
    with `power` clamp_min(sim, 1e-4)^int(power) off the diagonal, row-normalised (power 0:
    uniform). With w_gd the value is the mean of (w·t) over the active rows' N columns each,
    else over all N² entries. The h' → h direction is the same with the views swapped, so
    h'_i is pulled towards h_i by both directions' positive terms: the effective ratio is ≈ 2r.
    Returns the loss and, for telemetry, d1, d2 and the h → h' weights.
    """
    n = h1.shape[0]
    with torch.no_grad():
        s = h1 @ h2.T
        d1, d2 = margin_indicator(s, m), margin_indicator(s.T, m)  # over rows, then over columns
    positive = (h1 * h2).sum(dim=1)
    eye = diagonal_mask(n, h1.device)

    def direction(anchors: torch.Tensor, candidates: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, ...]:
        sim = torch.where(eye, positive[:, None], anchors @ candidates.detach().T)
        target = sim - r * positive[:, None]
        with torch.no_grad():
            if weights == "power":
                w = negative_power_weights(sim, int(power))  # the code casts power to int here
            else:
                w = (sim / tau).masked_fill(eye, -math.inf).softmax(dim=1)
        terms = w * target
        if not gd:
            return terms.mean(), w
        if not d.any():  # the code: mean of no rows = NaN; here this direction contributes nothing
            return 0.0 * terms.sum(), w
        return terms[d.bool()].mean(), w

    forward, w = direction(h1, h2, d1)
    backward, _ = direction(h2, h1, d2)
    if not gd:
        d1, d2 = torch.ones_like(d1), torch.ones_like(d2)
    return forward + backward, {"d1": d1, "d2": d2, "weights": w}


def mhe_loss(
    h1: torch.Tensor,
    h2: torch.Tensor,
    *,
    gd: bool,
    weighted: bool,
    ratio: float | None,
    m: float,
    tau: float,
    nu: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The `mhe` branch (`mhe[.w_gd][.w_w][.w_r]`): align + MHE and its modification.

    In words: g, g' the gated views; U = log Σ_{k>l} e^{g_k·g_l (/τ with w_w)} per view (no
    normalising constant, and e^{h_k·h_l} = e^{1 − ‖h_k−h_l‖²/2}: half the text's exponent);
    the alignment a_i = 2 − 2 g_i·g'_i; with w_w each view's coefficient
    c_i = Σ_{j≠i} e^{sg(a_ij)/τ} / (τ Σ_{k>l} e^{sg(a_kl)/τ}), else 1/N; with w_r times r.
    Value: ν (U + U') + Σ_i a_i (c_i + c'_i)/2.
    """
    g1, g2, d1, d2 = gated_views(h1, h2, gd=gd, m=m)
    scale = 1.0 / tau if weighted else 1.0
    a1, a2 = scale * (g1 @ g1.T), scale * (g2 @ g2.T)
    u1, u2 = lower_pairs(a1).logsumexp(dim=0), lower_pairs(a2).logsumexp(dim=0)
    with torch.no_grad():
        # each row's share of the pair sum: Σ_{j≠i} e^{a_ij} / Σ_{k>l} e^{a_kl}
        share1 = (negatives_logsumexp(a1) - u1).exp()
        share2 = (negatives_logsumexp(a2) - u2).exp()
        c1, c2 = (share1 * scale, share2 * scale) if weighted else (torch.full_like(d1, 1 / h1.shape[0]),) * 2
        factor = 1.0 if ratio is None else ratio
    alignment = 2.0 - 2.0 * (g1 * g2).sum(dim=1)
    loss = nu * (u1 + u2) + (alignment * c1 / 2 * factor).sum() + (alignment * c2 / 2 * factor).sum()
    with torch.no_grad():
        # ∂/∂h_i = ν share_i·scale Σ_j W_ij h_j − factor (c_i + c'_i) h'_i: R_i = factor (c + c') / (ν share·scale)
        effective_ratio = factor * (c1 + c2) / (nu * share1 * scale)
        w = (a1.detach()).masked_fill(diagonal_mask(h1.shape[0], h1.device), -math.inf).softmax(dim=1)
    return loss, {"d1": d1, "weights": w, "ratio": effective_ratio}


def mhs_loss(
    h1: torch.Tensor,
    h2: torch.Tensor,
    *,
    gd: bool,
    ratio: float | None,
    m: float,
    nu: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The `mhs` branch (`mhs[.w_gd][.w_r]`, no w_w): align + MHS and its modification.

    In words: cross-view distances to the other view's detached embeddings,
    D_ij = sqrt(‖g_i − sg(g'_j)‖² + 1e-4), and D'_ij the same from g'; MHS term
    U_i = −min_{j≠i} D_ij; the alignment a_i = 2 − 2 g_i·g'_i, times r·sg(1/min_{j≠i} D_ij)/2
    with w_r, else 1/2, per view. Value: ν (mean U + mean U') + mean (a c) + mean (a c').
    With the ratio the alignment weight is r (1/D_i + 1/D'_i)/2 over both directions.
    """
    n = h1.shape[0]
    g1, g2, d1, d2 = gated_views(h1, h2, gd=gd, m=m)
    eye = diagonal_mask(n, h1.device)

    def nearest_other(anchors: torch.Tensor, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        candidates = candidates.detach()
        # ‖a − b‖² expanded (the same value and gradient as the code's broadcast difference, in N² memory);
        # + 1e-4 keeps the root positive, as in the code
        squared = (anchors * anchors).sum(1)[:, None] + (candidates * candidates).sum(1)[None, :]
        distance = torch.sqrt(squared - 2.0 * anchors @ candidates.T + MHS_EPS)
        return distance.masked_fill(eye, math.inf).min(dim=1)

    nearest1, index1 = nearest_other(g1, g2)
    nearest2, _ = nearest_other(g2, g1)
    alignment = 2.0 - 2.0 * (g1 * g2).sum(dim=1)
    with torch.no_grad():
        if ratio is None:
            c1 = c2 = torch.full_like(d1, 0.5)
        else:
            c1, c2 = ratio / nearest1 / 2, ratio / nearest2 / 2
    loss = nu * ((-nearest1).mean() + (-nearest2).mean()) + (alignment * c1).mean() + (alignment * c2).mean()
    with torch.no_grad():
        # ∂/∂h_i = (ν / (N D_i)) (h'_j − R_i h'_i) with R_i = 2 (c_i + c'_i) D_i / ν
        effective_ratio = 2 * (c1 + c2) * nearest1 / nu
        w = torch.nn.functional.one_hot(index1, n).to(h1.dtype)
    return loss, {"d1": d1, "weights": w, "ratio": effective_ratio}


def decorrelation_loss(
    h1: torch.Tensor,
    h2: torch.Tensor,
    *,
    kind: str,
    gd: bool,
    weights: str,
    ratio: float | None,
    m: float,
    tau: float,
    power: float,
    nu: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The `vicreg` and `barlowtwins` branches (`…[.w_gd][.w_w][.w_r]`): summed over both directions.

    In words, one direction (u, u') = (g, g'), then (g', g): weights from the detached Gram
    matrix of u (VICReg) or of u' (Barlow Twins): without w_w linear, 2 sim_ij / N², diagonal
    included; with w_w e^{sim/τ} (`weights: exp`) or clamp_min(sim, 1e-4)^power (`power`),
    divided by their sum over k ≠ l (the diagonal stays in the numerator). The negative term
    is Σ_j w_ij u_i·sg(u_j). The positive term: with w_r ν r (Σ_{j≠i} w_ij)(−u_i·u'_i), live
    in both views; without it VICReg's −(2/N) u_i·sg(u'_i), Barlow's
    −Σ_k (2/N)(1 − (1 − ν) C_kk) u_ik sg(u'_ik) with C = sg(u)ᵀ sg(u')/N. Value: Σ_i (positive
    + ν negative). Without w_w these are the gradient surrogates of the original objectives
    (VICReg: ν (2/N²) Σ_j a_ij h_j − (2/N) h'_i; no centring, no variance hinge).
    """
    n = h1.shape[0]
    g1, g2, d1, d2 = gated_views(h1, h2, gd=gd, m=m)
    off = ~diagonal_mask(n, h1.device)

    def one_direction(u: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            basis = u if kind == "vicreg" else other
            similarity = basis @ basis.T
            if weights == "linear":
                w = similarity / n * 2 / n
            elif weights == "exp":
                logits = similarity / tau  # e^{sim/τ} / Σ_{k≠l} e^{sim/τ}, in the log domain (no overflow)
                w = (logits - logits[off].logsumexp(dim=0)).exp()
            else:
                w = power_weights(similarity, power)
                w = w / w[off].sum()
        negative = (w * (u @ u.detach().T)).sum(dim=1)
        if ratio is not None:
            positive = nu * ratio * (w * off).sum(dim=1) * -(u * other).sum(dim=1)
        elif kind == "vicreg":
            positive = -(u * other.detach()).sum(dim=1) * 2 / n
        else:
            with torch.no_grad():
                correlation = u.T @ other / n
                per_dimension = (1 - (1 - nu) * correlation.diagonal()) * 2 / n
            positive = (per_dimension * -(u * other.detach())).sum(dim=1)
        return (positive + nu * negative).sum(), w

    forward, w1 = one_direction(g1, g2)
    backward, w2 = one_direction(g2, g1)
    telemetry: dict[str, torch.Tensor] = {"d1": d1}
    with torch.no_grad():
        if weights != "linear":  # positive weights: a share and a ratio are defined
            row1, row2 = (w1 * off).sum(dim=1), (w2 * off).sum(dim=1)
            telemetry["weights"] = w1 * off
            if ratio is not None:  # ∂/∂h_i = ν Σ_j w_ij h_j − ν r (S_i + S'_i) h'_i
                telemetry["ratio"] = ratio * (row1 + row2) / row1
            elif kind == "vicreg":
                telemetry["ratio"] = (2 / n) / (nu * row1)
    return forward + backward, telemetry
