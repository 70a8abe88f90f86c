"""A grid sweep's figures: best dev against each swept number (the paradigm paper's Figure 6), and a heatmap; and
how a sweep's numbers are written for people (4 significant digits)."""

from __future__ import annotations

import math
import statistics
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from sentemb.eval.figures import save_figure


def four_digits(value: float | None) -> str:
    """`value` to 4 significant digits, trailing zeros kept (83.50, 0.3075, 3.000e-05); – for a missing value."""
    if value is None or math.isnan(value):
        return "–"
    return f"{value:#.4g}".replace(".e", "e").rstrip(".")  # `#` keeps trailing zeros, and a bare point: 1234.


def readable(value: str) -> str:
    """A swept value as people read it: a number written with more than 4 significant digits (an Optuna sample,
    0.30745401188473626) to 4 (0.3075); anything else as written (3e-5, 1.00, an integer, a name)."""
    try:
        number = Decimal(value)
    except InvalidOperation:
        return value
    if value.lstrip("+-").isdigit() or not number.is_finite() or len(number.normalize().as_tuple().digits) <= 4:
        return value
    return f"{float(value):.4g}"


def plain_ticks(figure: Any) -> None:
    """Tick labels as the numbers themselves: no `+4.218e1` offset above the axis for scores close together."""
    from matplotlib.ticker import ScalarFormatter

    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if isinstance(axis.get_major_formatter(), ScalarFormatter):
                axis.get_major_formatter().set_useOffset(False)


def _numeric(values: list[str]) -> list[float] | None:
    try:
        return [float(v) for v in values]
    except ValueError:
        return None


def _ordered(values: list[str]) -> list[str]:
    numbers = _numeric(values)
    return [v for _, v in sorted(zip(numbers, values, strict=True))] if numbers else sorted(values)


def grid_figures(sweep_dir: Path, rows: list[dict[str, Any]], params: list[str]) -> list[Path]:
    """sweep_<param>.png per numeric parameter, and sweep_heatmap.png over the two with the most values."""
    import matplotlib.pyplot as plt  # the commands choose the file-only backend (sentemb.common.process)

    ok = [r for r in rows if r["status"] == "ok" and r["best_dev"] is not None]
    levels = {p: _ordered(list({r[p] for r in ok})) for p in params}
    by_size = sorted((p for p in params if len(levels[p]) > 1), key=lambda p: -len(levels[p]))
    written = []
    for param in by_size:
        xs = _numeric(levels[param])
        if xs is None:
            continue
        other = next((p for p in by_size if p != param), None)
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for line in levels[other] if other else [None]:
            means, stds = [], []
            for level in levels[param]:
                devs = [r["best_dev"] for r in ok if r[param] == level and (other is None or r[other] == line)]
                means.append(statistics.fmean(devs) if devs else math.nan)
                stds.append(statistics.stdev(devs) if len(devs) > 1 else 0.0)
            ax.errorbar(
                xs, means, yerr=stds, marker="o", capsize=3, label=f"{other}={readable(line)}" if other else None
            )
        ax.set(xlabel=param, ylabel="best STS-B dev Spearman", title=f"{sweep_dir.name}: {param}")
        if other:
            ax.legend(fontsize=8)
        plain_ticks(fig)
        fig.tight_layout()
        written.append(save_figure(fig, sweep_dir / f"sweep_{param}.png", dpi=120))
    if len(by_size) >= 2:
        rows_param, cols_param = by_size[0], by_size[1]
        grid = [
            [
                statistics.fmean(d)
                if (d := [r["best_dev"] for r in ok if r[rows_param] == a and r[cols_param] == b])
                else math.nan
                for b in levels[cols_param]
            ]
            for a in levels[rows_param]
        ]
        fig, ax = plt.subplots(figsize=(1.2 * len(levels[cols_param]) + 2.5, 0.8 * len(levels[rows_param]) + 1.8))
        image = ax.imshow(grid, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(levels[cols_param])), [readable(v) for v in levels[cols_param]])
        ax.set_yticks(range(len(levels[rows_param])), [readable(v) for v in levels[rows_param]])
        ax.set(xlabel=cols_param, ylabel=rows_param, title=f"{sweep_dir.name}: mean best dev")
        for i, row in enumerate(grid):
            for j, value in enumerate(row):
                if not math.isnan(value):
                    ax.text(j, i, four_digits(value), ha="center", va="center", color="white", fontsize=8)
        fig.colorbar(image, ax=ax)
        fig.tight_layout()
        written.append(save_figure(fig, sweep_dir / "sweep_heatmap.png", dpi=120))
    return written
