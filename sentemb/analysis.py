"""The paradigm paper's theoretical analysis (Section 3.1) as a command.

    python -m sentemb.analysis simulate [--out DIR [--overwrite]] [--grid 100] [--batches 1000] [--seed 0]

Angles θ_ii' ~ N(μ_pos, 0.05²) and θ_ij' ~ N(μ_neg, 0.10²), μ_pos ∈ [π/20, π/2], μ_neg ∈
[π/20, π], one positive and 127 negatives per batch, `--batches` batches per (μ_pos, μ_neg)
cell on a `--grid` × `--grid` grid (the paper: 100 × 100, 1,000), with a progress bar over the
cells. Writes into a new folder, outputs/analysis/simulate/<date>_<time>/, unless `--out DIR` names
one; a DIR that already holds these outputs is refused unless `--overwrite` is passed:
  figure2_gradient_dissipation.png   mean GD per cell for every loss with a GD (Figures 2 and 10)
  figure3_hardest_negative_share.png mean share of W held by the hardest negative vs μ_neg at
                                     μ_pos = π/6, per τ and per loss (Figure 3)
  figure4_dynamic_ratio.png          mean dynamic ratio per cell (Figure 4), with the cells that do
                                     not occur in training shaded (μ_pos ≥ μ_neg; GD dissipated)
  simulation.npz                     every array plotted
Each loss's hyper-parameters are its conf/loss defaults. The batches are common random numbers:
one set of standard-normal draws is shifted and scaled into every cell, so neighbouring cells
differ by their means only; angles are clipped into [0, π]. Non-contrastive originals have GD ≡ 1
(Table 2) and are not drawn in Figure 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from sentemb.common.errors import SentembConfigError
from sentemb.common.folder_lock import enclosing_locks
from sentemb.common.process import configure_process
from sentemb.common.published_files import published
from sentemb.eval.figures import save_figure
from sentemb.losses import build

SIGMA_POS, SIGMA_NEG = 0.05, 0.10
NEGATIVES = 127
FIGURE3_TAUS = (0.01, 0.03, 0.05, 0.1, 0.3, 1.0)
OUTPUTS = (
    "figure2_gradient_dissipation.png",
    "figure3_hardest_negative_share.png",
    "figure4_dynamic_ratio.png",
    "simulation.npz",
)

# one cell's quantity from cos θ_ii' (B,) and cos θ_ij' (B, 127), with θ_ii' (B,) for ArcCon
Quantity = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def softmax_share(logits: torch.Tensor) -> torch.Tensor:
    """Share of the largest of exponential weights over the negatives."""
    return logits.softmax(dim=-1).max(dim=-1).values


def gradient_dissipations() -> dict[str, Quantity]:
    """GD of every loss that has one, in the angular form of Table 1 / the spec."""
    infonce, arccon, mpt, met = build("infonce"), build("arccon"), build("mpt"), build("met")
    focal, paradigm = build("focal"), build("paradigm")

    def infonce_gd(pos, neg, theta_pos, theta_neg):
        return torch.sigmoid((neg / infonce.tau).logsumexp(-1) - pos / infonce.tau)

    def arccon_gd(pos, neg, theta_pos, theta_neg):
        return torch.sigmoid((neg / arccon.tau).logsumexp(-1) - torch.cos(theta_pos + arccon.u) / arccon.tau)

    def mpt_gd(pos, neg, theta_pos, theta_neg):
        return (pos - neg.max(-1).values < mpt.m).to(pos.dtype)

    def met_gd(pos, neg, theta_pos, theta_neg):
        return (torch.sqrt(2 - 2 * neg.max(-1).values) - torch.sqrt(2 - 2 * pos) < met.m).to(pos.dtype)

    def margin_gd(pos, neg, theta_pos, theta_neg):
        return (pos - neg.max(-1).values < paradigm.m).to(pos.dtype)

    def focal_gd(pos, neg, theta_pos, theta_neg):  # 1 − P_ii
        return torch.sigmoid((neg * (neg + focal.m) / focal.tau).logsumexp(-1) - pos * pos / focal.tau)

    return {
        f"InfoNCE (τ={infonce.tau:g})": infonce_gd,
        f"ArcCon (τ={arccon.tau:g}, u=10°)": arccon_gd,
        f"MPT (m={mpt.m:g})": mpt_gd,
        f"MET (m={met.m:g})": met_gd,
        f"margin m={paradigm.m:g}: paradigm, mMHE, mMHS, mB, mV": margin_gd,
        f"Focal-InfoNCE (τ={focal.tau:g}, m={focal.m:g})": focal_gd,
    }


def hardest_shares() -> dict[str, Quantity]:
    """Share of W held by the hardest negative, for the losses whose W is not one-hot."""
    infonce, focal, mmhe = build("infonce"), build("focal"), build("mmhe")
    return {
        f"InfoNCE / ArcCon / paradigm (τ={infonce.tau:g})": lambda p, n, tp, tn: softmax_share(n / infonce.tau),
        f"mMHE / mB / mV (τ={mmhe.tau:g})": lambda p, n, tp, tn: softmax_share(n / mmhe.tau),
        # the exponential part of Focal's W, as its training telemetry logs it (its (2s+m) factor is signed)
        f"Focal-InfoNCE (τ={focal.tau:g}, m={focal.m:g})": lambda p, n, tp, tn: softmax_share(
            n * (n + focal.m) / focal.tau
        ),
        "align+MHE (W ∝ e^{2cos})": lambda p, n, tp, tn: softmax_share(2 * n),
        "MPT / MET / MHS / mMHS (one-hot W)": lambda p, n, tp, tn: torch.ones_like(p),
    }


def dynamic_ratios() -> dict[str, Quantity]:
    """R of ArcCon, of MET (at its hardest negative), and of r=met under softmax W (the W-weighted mean)."""
    arccon, paradigm = build("arccon"), build("paradigm")

    def arccon_r(pos, neg, theta_pos, theta_neg):
        return torch.sin(theta_pos + arccon.u) / torch.sin(theta_pos).clamp_min(1e-6)

    def met_r(pos, neg, theta_pos, theta_neg):
        return torch.sqrt((1 - neg.max(-1).values) / (1 - pos).clamp_min(1e-12))

    def met_softmax_r(pos, neg, theta_pos, theta_neg):
        weights = (neg / paradigm.tau).softmax(-1)
        return (weights * torch.sqrt((1 - neg) / (1 - pos).clamp_min(1e-12)[..., None])).sum(-1)

    return {
        "ArcCon: sin(θ_ii'+u)/sin θ_ii'": arccon_r,
        "MET: sqrt((1−cos θ_ij')/(1−cos θ_ii')), hardest j": met_r,
        f"paradigm r=met, softmax W (τ={paradigm.tau:g})": met_softmax_r,
    }


def cell_means(
    quantities: dict[str, Quantity],
    mu_pos: torch.Tensor,
    mu_neg: torch.Tensor,
    batches: int,
    seed: int,
    progress: tqdm | None = None,
) -> dict[str, np.ndarray]:
    """Mean of each quantity over `batches` batches for every (μ_pos, μ_neg) pair: arrays (len(mu_pos), len(mu_neg)).
    `progress` counts the cells done (one per quantity and pair)."""
    gen = torch.Generator().manual_seed(seed)
    unit_pos = torch.randn(batches, generator=gen, dtype=torch.float64)
    unit_neg = torch.randn(batches, NEGATIVES, generator=gen, dtype=torch.float64)
    out = {name: np.zeros((len(mu_pos), len(mu_neg))) for name in quantities}
    for row, mp in enumerate(mu_pos):  # one μ_pos at a time: (μ_neg, batch, 127) fits in memory
        theta_pos = (mp + SIGMA_POS * unit_pos).clamp(0, math.pi).expand(len(mu_neg), batches)
        theta_neg = (mu_neg[:, None, None] + SIGMA_NEG * unit_neg).clamp(0, math.pi)
        pos, neg = torch.cos(theta_pos), torch.cos(theta_neg)
        for name, quantity in quantities.items():
            out[name][row] = quantity(pos, neg, theta_pos, theta_neg).mean(dim=-1).numpy()
            if progress is not None:
                progress.update(len(mu_neg))
    return out


def default_out_dir() -> Path:
    """A new folder per run, so an earlier run's figures are never replaced."""
    return Path("outputs/analysis/simulate") / datetime.now().strftime("%Y-%m-%d_%H-%M-%S_%f")


def check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse to replace an earlier simulation's outputs unless asked to, before the minutes of sampling."""
    existing = [name for name in OUTPUTS if (out_dir / name).exists()]
    if existing and not overwrite:
        raise SentembConfigError(
            f"--out {out_dir} already holds {', '.join(existing)} from an earlier simulation. Fix: pass --overwrite "
            "to replace them (overwrite=True from Python), give another --out, or leave --out out for a new folder"
        )
    if existing:
        print(f"--overwrite: replacing {', '.join(existing)} in {out_dir}", flush=True)


def simulate(
    out_dir: Path, grid: int = 100, batches: int = 1000, seed: int = 0, overwrite: bool = False
) -> dict[str, Path]:
    """Compute Figures 2–4's arrays and write the PNGs; returns the written paths. An `out_dir` that holds an
    earlier simulation's outputs is refused (SentembConfigError) unless `overwrite`; so is one that another live
    command writes in (its own lock file, or a folder above it: a training run's), before the minutes of sampling."""
    check_out_dir(out_dir, overwrite)
    # the locks of out_dir (where one is) and of the folders above it, held until the figures are written
    with enclosing_locks(out_dir / "figures", f"--out {out_dir}", "wait for it to finish, or give another --out"):
        return simulated(out_dir, grid, batches, seed)


def simulated(out_dir: Path, grid: int, batches: int, seed: int) -> dict[str, Path]:
    """`simulate` once `out_dir` is this command's."""
    import matplotlib.pyplot as plt  # main chose the file-only backend (sentemb.common.process)

    mu_pos = torch.linspace(math.pi / 20, math.pi / 2, grid, dtype=torch.float64)
    mu_neg = torch.linspace(math.pi / 20, math.pi, grid, dtype=torch.float64)
    fixed_pos = torch.tensor([math.pi / 6], dtype=torch.float64)
    by_tau = {f"τ = {tau:g}": (lambda t: lambda p, n, tp, tn: softmax_share(n / t))(tau) for tau in FIGURE3_TAUS}
    gds, rs, shares = gradient_dissipations(), dynamic_ratios(), hardest_shares()
    cells = ((len(gds) + len(rs)) * grid + len(by_tau) + len(shares)) * grid  # one per quantity and (μ_pos, μ_neg)
    with tqdm(total=cells, desc="simulate", unit="cell", unit_scale=True) as progress:
        dissipation = cell_means(gds, mu_pos, mu_neg, batches, seed, progress)
        ratios = cell_means(rs, mu_pos, mu_neg, batches, seed, progress)
        shares_tau = {k: v[0] for k, v in cell_means(by_tau, fixed_pos, mu_neg, batches, seed, progress).items()}
        shares_loss = {k: v[0] for k, v in cell_means(shares, fixed_pos, mu_neg, batches, seed, progress).items()}
    out_dir.mkdir(parents=True, exist_ok=True)  # only now: an interrupted simulation leaves no empty folder
    extent = [mu_neg[0].item(), mu_neg[-1].item(), mu_pos[0].item(), mu_pos[-1].item()]
    paths = {}

    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5), constrained_layout=True)
    for ax, (name, values) in zip(axes.flat, dissipation.items(), strict=True):
        image = ax.imshow(values, origin="lower", extent=extent, aspect="auto", vmin=0, vmax=1, cmap="viridis")
        ax.set(title=name, xlabel="μ_neg (rad)", ylabel="μ_pos (rad)")
        ax.plot([extent[2], extent[3]], [extent[2], extent[3]], "w--", lw=0.8)
    fig.colorbar(image, ax=axes, label="mean gradient dissipation")
    fig.suptitle(f"Figure 2: GD over μ_pos–μ_neg ({grid}×{grid} cells, {batches} batches of 1+{NEGATIVES} each)")
    paths["figure2"] = out_dir / "figure2_gradient_dissipation.png"
    save_figure(fig, paths["figure2"], dpi=110)

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), constrained_layout=True)
    for name, values in shares_tau.items():
        left.plot(mu_neg.numpy(), values, label=name)
    left.set(title="softmax W: hardest negative's share by τ (μ_pos = π/6)", xlabel="μ_neg (rad)", ylabel="share")
    left.legend()
    for name, values in shares_loss.items():
        right.plot(mu_neg.numpy(), values, label=name)
    right.set(title="per loss, default hyper-parameters (μ_pos = π/6)", xlabel="μ_neg (rad)", ylabel="share")
    right.legend(fontsize=8)
    fig.suptitle("Figure 3: mean share of W held by the hardest negative")
    paths["figure3"] = out_dir / "figure3_hardest_negative_share.png"
    save_figure(fig, paths["figure3"], dpi=110)

    # cells that do not occur in training: μ_pos ≥ μ_neg, or GD (margin m=0.3) already dissipated
    margin = next(values for name, values in dissipation.items() if name.startswith("margin"))  # paradigm, mMHE, …
    unreachable = (mu_pos[:, None] >= mu_neg[None, :]).numpy() | (margin < 0.01)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), constrained_layout=True)
    for ax, (name, values) in zip(axes, ratios.items(), strict=True):
        shown = np.clip(values, 0, 3)
        image = ax.imshow(shown, origin="lower", extent=extent, aspect="auto", vmin=0, vmax=3, cmap="magma")
        ax.imshow(
            np.where(unreachable, 1.0, np.nan), origin="lower", extent=extent, aspect="auto", cmap="Greys", alpha=0.45
        )
        ax.contour(mu_neg.numpy(), mu_pos.numpy(), values, levels=[1.0, 2.0], colors=["cyan", "white"], linewidths=0.8)
        ax.set(title=name, xlabel="μ_neg (rad)", ylabel="μ_pos (rad)")
    fig.colorbar(image, ax=axes, label="mean ratio R (clipped at 3; contours at 1 and 2)")
    fig.suptitle("Figure 4: dynamic ratios; shaded: μ_pos ≥ μ_neg or GD (margin 0.3) < 0.01")
    paths["figure4"] = out_dir / "figure4_dynamic_ratio.png"
    save_figure(fig, paths["figure4"], dpi=110)

    arrays = {"mu_pos": mu_pos.numpy(), "mu_neg": mu_neg.numpy()}
    for prefix, table in (("gd", dissipation), ("ratio", ratios), ("share_tau", shares_tau), ("share", shares_loss)):
        arrays.update({f"{prefix}: {name}": values for name, values in table.items()})
    paths["arrays"] = out_dir / "simulation.npz"
    with published(paths["arrays"], "wb") as handle:  # whole, and never through a link (published_files)
        np.savez_compressed(handle, **arrays)
    return paths


def main(argv: list[str] | None = None) -> None:
    configure_process()
    parser = argparse.ArgumentParser(prog="python -m sentemb.analysis", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sim = commands.add_parser("simulate", help="Figures 2–4 of the paradigm paper from sampled angles")
    sim.add_argument("--out", type=Path, default=None, help="default: a new outputs/analysis/simulate/<date>_<time>/")
    sim.add_argument("--overwrite", action="store_true", help="replace the outputs an earlier run left in --out")
    sim.add_argument("--grid", type=int, default=100, help="cells per axis (paper: 100)")
    sim.add_argument("--batches", type=int, default=1000, help="batches per cell (paper: 1,000)")
    sim.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.grid < 2 or args.batches < 1:
        parser.error(f"--grid must be >= 2 and --batches >= 1 (got --grid {args.grid}, --batches {args.batches})")
    out_dir = args.out or default_out_dir()
    print(f"simulating Figures 2–4 into {out_dir}", flush=True)
    try:
        paths = simulate(out_dir, args.grid, args.batches, args.seed, overwrite=args.overwrite)
    except SentembConfigError as err:
        sys.exit(f"sentemb: {err}")
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
