"""What every objective shares: its output type, the normalisation, and hyper-parameter checks.

Conventions (docs/objectives.md): a loss takes one batch by role (`LossInputs`, losses/inputs.py: the anchors,
their positives, any hard negatives, a negatives part's extra negatives and exclusions, scores, ...), normalises the
embeddings itself, computes similarities in float32 (float64 inputs stay float64, for gradient tests) with autocast
off, and uses one direction (h anchors against h' candidates) unless `symmetric=True`, which averages both directions.

`convention`: `paper` (default) computes the paper's text; `reference` computes what the
paper's public code computes for the same settings (sentemb/losses/reference.py), with that
code's own direction handling, so `symmetric` is not used there.

Extra negatives (ESimCSE's momentum queue: `extra`, (K, D)) and labelled hard negatives (supervised SimCSE:
`hard_negatives`) are extra candidate columns of the h → h' direction: an N×M similarity matrix whose column i is
anchor i's positive and every other column a negative (the layout is `LossInputs`'); `symmetric=True` gives the h' → h
direction cat(h, the same others). K = 0 computes exactly the loss without them. Which losses take them is declared per
class, readable before anything is built: `Objective.negatives_refusal(config)` is None, or the reason as one sentence
(a loss with no negatives' denominator refuses them); `hard_negatives_refusal` and `scores_refusal` likewise.

False negatives (DCLR's instance weights: `excluded`, (N, N + K) bool, True where candidate j is a false negative of
anchor i, never on the diagonal) and duplicated texts (`duplicates`) leave the negatives: `directional` gets the one
mask `LossInputs.candidate_exclusion()` as the keyword `excluded` only when there is one, so a loss of your own
without that keyword keeps working as long as nothing is excluded. With `symmetric=True` the h' → h direction's mask
is the transpose of the N×N block, its other columns unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from sentemb.common.errors import SentembConfigError
from sentemb.common.numbers import (  # noqa: F401 (the number checks live in common/, torch-free; re-exported here)
    ANY,
    NON_NEGATIVE,
    OPEN_UNIT,
    POSITIVE,
    Bounds,
    require_number,
    require_whole,
    shown,
)
from sentemb.losses.inputs import EXTRA, HARD_NEGATIVES, PAIRS, SCORES, LossInputs


class LazyStats(Mapping[str, Any]):
    """A loss's telemetry, computed on first read (without gradients, autocast off) and then kept.

    Training reads it only on logging steps (SentembModule.on_train_batch_end), so the other
    steps pay nothing for it; `compute` holds the step's tensors until then.
    """

    def __init__(self, compute: Callable[[], Mapping[str, Any]], device: torch.device) -> None:
        self._compute: Callable[[], Mapping[str, Any]] | None = compute
        self._device_type = device.type
        self._values: dict[str, Any] = {}

    def _resolved(self) -> dict[str, Any]:
        if self._compute is not None:
            with torch.no_grad(), torch.autocast(device_type=self._device_type, enabled=False):
                self._values = dict(self._compute())
            self._compute = None  # frees the captured tensors
        return self._values

    def __getitem__(self, key: str) -> Any:
        return self._resolved()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._resolved())

    def __len__(self) -> int:
        return len(self._resolved())

    def __repr__(self) -> str:
        return f"LazyStats({self._values if self._compute is None else 'not computed yet'})"


@dataclass
class LossOutput:
    """The scalar to minimise, the floats worth logging (`stats`, often a LazyStats), and per-term values of a sum
    (detached scalars)."""

    loss: torch.Tensor
    stats: Mapping[str, float] = field(default_factory=dict)
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


def normalize(z: torch.Tensor) -> torch.Tensor:
    """Unit vectors; half precision is promoted to float32 (spec: similarities in float32)."""
    if z.dtype not in (torch.float32, torch.float64):
        z = z.float()
    return F.normalize(z, dim=-1)


CONVENTIONS = ("paper", "reference")
# what a loss learns from (`Objective.learns_from`): the pre-run checks look for it in the rows (training/learnable.py)
IN_BATCH_NEGATIVES = "in-batch negatives"  # another row's text that is not masked as a duplicate of the anchor's
RANKED_SCORES = "scores to rank"  # two pairs of unequal scores: a ranking loss has no term without them


class Objective(nn.Module):
    """Base class: `forward(inputs: LossInputs) -> LossOutput` (`loss(z1, z2, **roles)` for short); a contrastive loss
    implements `directional(h1, h2)` (and `directional(h1, h2, excluded=...)` where it takes extra negatives), a loss
    of another form overrides `compute(inputs)`.

    `directional` gets unit vectors in float32/float64 (autocast off) and returns the loss
    with h1 (N, D) as anchors and h2 (M, D), M ≥ N, as candidates: h2[i] is anchor i's positive and
    every other row a negative (M > N: hard negatives and extra negatives after the batch's own, `LossInputs`' layout);
    `symmetric=True` averages it with the swapped call. Under `convention="reference"` `reference(h1, h2)` is called
    instead, once, with both views.

    What a loss reads and takes is declared on its class and checked against the data before any model loads:
    `reads` (the roles it needs), `no_negatives` (why it takes no extra negatives, one clause, or None where
    `directional` handles M > N; the default refuses, so a new loss takes a queue only once it says it can),
    `reference_no_negatives` (why `convention=reference` refuses them where `reference` is overridden),
    `learns_from`, `hard_negative_fields`, `conventions`, `has_symmetric` and `telemetry`.
    """

    symmetric: bool = False
    convention: str = "paper"
    # the roles of `LossInputs` this loss needs (losses/inputs.py): the pairs; a scored loss's `scores` too. What it
    # takes beyond them is declared by `no_negatives` (extra columns, exclusions, hard negatives as columns)
    reads: ClassVar[frozenset[str]] = PAIRS
    # the conventions its `convention` field takes, and whether it has a `symmetric` form (both are config fields)
    conventions: ClassVar[tuple[str, ...]] = ("paper", "reference")
    has_symmetric: ClassVar[bool] = True
    # the telemetry keys its `LossOutput.stats` offers (the paradigm's: geometry.PARADIGM_TELEMETRY); none by default
    telemetry: ClassVar[tuple[str, ...]] = ()
    # a loss around other losses (loss=sum): built from its terms' configs, it has no form of its own to build alone
    wraps_losses: ClassVar[bool] = False
    no_negatives: ClassVar[str | None] = "it declares no form with extra negatives (no_negatives is not None)"
    # why, where `reference` is overridden (the public code's own form) and `convention=reference` is chosen
    reference_no_negatives: ClassVar[str] = "the public code's computation, which that convention reproduces, has none"
    # what the rows must hold for the loss to be other than 0 at every step: IN_BATCH_NEGATIVES, RANKED_SCORES or None
    learns_from: ClassVar[str | None] = None
    # the config fields that act on labelled hard negatives only (InfoNCE's hard_negative_weight): unused without them
    hard_negative_fields: ClassVar[tuple[str, ...]] = ()

    def directional(self, h1: torch.Tensor, h2: torch.Tensor) -> LossOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def reference(self, h1: torch.Tensor, h2: torch.Tensor, excluded: torch.Tensor | None = None) -> LossOutput:
        """The public code's computation for this loss's settings; the same as the paper's one direction
        unless a subclass says otherwise (InfoNCE, MPT: the code computes the text's loss). Where it is
        not overridden it takes extra negatives (h2 then has N + K rows) and `excluded` as `directional` does."""
        return self.directional(h1, h2) if excluded is None else self.directional(h1, h2, excluded=excluded)

    def set_convention(self, convention: str, symmetric: bool) -> None:
        """`convention` and `symmetric`, refusing `symmetric` where the public code fixes the directions."""
        self.convention = require_choice("convention", convention, CONVENTIONS)
        if self.convention == "reference" and symmetric:
            raise SentembConfigError(
                f"loss.symmetric=true with loss.convention=reference: {type(self).__name__}'s reference form has "
                "the public code's own direction handling. Fix: loss.symmetric=false, or loss.convention=paper"
            )
        self.symmetric = symmetric

    @classmethod
    def negatives_refusal(cls, config: Mapping[str, Any]) -> str | None:
        """None if this loss, configured by `config` (a loss config: its fields, `name` optional), takes
        extra negatives; else the reason, one sentence. Reads the class and the config only (nothing built).

        Refused: a loss with `no_negatives`, and under `convention=reference` any loss whose reference form
        is its own (it overrides `reference`): the public code's computation has no extra negatives.
        """
        name = config.get("name") or registered_name(cls)
        if cls.no_negatives is not None:
            return f"loss={name} takes no extra negatives: {cls.no_negatives}."
        if config.get("convention", "paper") == "reference" and cls.reference is not Objective.reference:
            return f"loss={name} with loss.convention=reference takes no extra negatives: {cls.reference_no_negatives}."
        return None

    @classmethod
    def learning_need(cls, config: Mapping[str, Any]) -> str | None:
        """What the rows must hold for this loss, configured by `config`, to learn (`learns_from`); read from the class
        and the config only. In-batch negatives are asked only where duplicates are masked out of them: a loss that
        takes extra negatives (the step masks duplicates for it: `Objective.takes_negatives`); else a duplicate is
        scored as a negative."""
        if cls.learns_from == IN_BATCH_NEGATIVES and cls.negatives_refusal(config) is not None:
            return None
        return cls.learns_from

    @classmethod
    def hard_negative_settings(cls, config: Mapping[str, Any], key: str = "loss") -> list[str]:
        """`key.field=value` of each field of `config` acting on labelled hard negatives only and set (nonzero)."""
        return [f"{key}.{name}={config[name]}" for name in cls.hard_negative_fields if config.get(name)]

    @classmethod
    def width_refusal(cls, width: int) -> str | None:
        """Why this loss cannot take embeddings `width` wide (one clause), or None: any width by default."""
        return None

    @classmethod
    def hard_negatives_refusal(cls, config: Mapping[str, Any]) -> str | None:
        """None if this loss, configured by `config`, takes labelled hard negatives: it reads them itself (`reads`),
        or scores them as extra candidate columns (a negatives' denominator, `negatives_refusal`); else the reason."""
        if HARD_NEGATIVES in cls.reads:
            return None
        refusal = cls.negatives_refusal(config)
        if refusal is None:
            return None
        name = config.get("name") or registered_name(cls)
        return f"loss={name} takes no hard negatives: they are extra candidate columns of a loss, and {refusal}"

    @classmethod
    def scores_refusal(cls, config: Mapping[str, Any], scored: bool) -> str | None:
        """Why this loss cannot train on rows with (`scored`) or without scores, or None: a loss that reads scores
        (`reads`) needs them, and scored rows need a loss that reads them (else their scores are ignored)."""
        name = config.get("name") or registered_name(cls)
        if scored and SCORES not in cls.reads:
            return (
                f"scored data needs a scored loss: loss={name} would read the pairs as positives and ignore the scores"
            )
        if not scored and SCORES in cls.reads:
            return f"loss={name} learns from scored pairs, and these rows hold no scores"
        return None

    def offered_telemetry(self) -> tuple[str, ...]:
        """The keys its `LossOutput.stats` offers (`telemetry`; a wrapper's are its terms')."""
        return self.telemetry

    def takes_negatives(self) -> bool:
        """Whether this built loss (its own convention) has a negatives' denominator: extra columns, exclusions and
        duplicates masked out of it."""
        return type(self).negatives_refusal({"convention": self.convention}) is None

    def refuses_negatives(self) -> str | None:
        """`negatives_refusal` for this built loss (its own convention)."""
        return type(self).negatives_refusal({"convention": self.convention})

    def refuses_hard_negatives(self) -> str | None:
        """`hard_negatives_refusal` for this built loss: None where it reads them or scores them as columns."""
        return None if HARD_NEGATIVES in self.reads else self.refuses_negatives()

    @classmethod
    def reads_of(cls, config: Mapping[str, Any]) -> frozenset[str]:
        """The roles a loss configured by `config` reads (`reads`; a loss around losses: its terms' too)."""
        return cls.reads

    def accept(self, inputs: LossInputs) -> None:
        """The inputs checked against what this loss declares: every role it reads held, extra negatives, exclusions
        and hard negatives only where it takes them (refused even for an empty queue: the configuration is wrong,
        not the step), and their shapes."""
        refusal = self.refuses_negatives()
        if inputs.extra is not None and refusal is not None:
            raise SentembConfigError(
                f"{refusal} Fix: a loss with a negatives' denominator (e.g. loss=infonce), or no negatives= part"
            )
        if inputs.excluded is not None and refusal is not None:
            raise SentembConfigError(
                f"{refusal} Excluding false negatives removes terms of a negatives' denominator. Fix: a loss with "
                "a negatives' denominator (e.g. loss=infonce), or no negatives= part that excludes false negatives"
            )
        if inputs.hard_negatives and self.refuses_hard_negatives() is not None:
            raise SentembConfigError(
                f"{type(self).__name__} takes no hard negatives: {refusal} Fix: a loss with a negatives' "
                "denominator (e.g. loss=infonce), or pairs without a hard-negative column"
            )
        width = inputs.anchors.shape[1]
        if inputs.extra is not None and (inputs.extra.dim() != 2 or inputs.extra.shape[1] != width):
            raise ValueError(
                f"{type(self).__name__}: extra negatives must be (K, D) with D = {width} like the views, "
                f"got {tuple(inputs.extra.shape)}"
            )
        if inputs.excluded is not None:
            n = inputs.size
            columns = n + (0 if inputs.extra is None else inputs.extra.shape[0])
            excluded = inputs.excluded
            if excluded.dtype != torch.bool or tuple(excluded.shape) != (n, columns):
                raise ValueError(
                    f"{type(self).__name__}: excluded must be a bool (N, N + K) = ({n}, {columns}) tensor (N anchors, "
                    f"their N + K candidates), got {excluded.dtype} {tuple(excluded.shape)}"
                )
            if bool(excluded[:, :n].diagonal().any()):
                raise ValueError(
                    f"{type(self).__name__}: excluded is True on the diagonal: anchor i's candidate i is its "
                    "positive, never a false negative"
                )
        self.check_reads(inputs)

    def check_reads(self, inputs: LossInputs) -> None:
        """Every role this loss reads (`reads`) is held by `inputs`."""
        missing = sorted(self.reads - inputs.present() - {EXTRA})
        if missing:
            raise ValueError(
                f"{type(self).__name__} reads {', '.join(missing)}, which these inputs do not hold: pass them by role "
                f"(LossInputs(anchors=..., positives=..., {missing[0]}=...))"
            )

    def forward(
        self,
        inputs: LossInputs | torch.Tensor,
        positives: torch.Tensor | None = None,
        extra: torch.Tensor | None = None,
        excluded: torch.Tensor | None = None,
        **roles: Any,
    ) -> LossOutput:
        """The loss of one batch by role (`LossInputs`); `loss(z1, z2, extra, excluded, scores=...)` is short for
        `loss(LossInputs(anchors=z1, positives=z2, extra=extra, excluded=excluded, scores=...))`."""
        inputs = as_inputs(inputs, positives, {"extra": extra, "excluded": excluded, **roles})
        self.accept(inputs)
        return self.compute(inputs)

    def compute(self, inputs: LossInputs) -> LossOutput:
        """The contrastive form (module docstring): each anchor against its candidates, `directional` in one or
        both directions, or `reference` under `convention=reference`."""
        z1, z2 = inputs.anchors, inputs.positives
        others = inputs.others()
        excluded = inputs.candidate_exclusion()
        if z1.shape[0] < 2 and (others is None or z1.shape[0] == 0):
            # a trailing batch of one sentence has no negatives (unless a queue gives some): nothing to learn
            return LossOutput(0.0 * (z1.sum() + z2.sum()).float())
        with torch.autocast(device_type=z1.device.type, enabled=False):
            h1, h2 = normalize(z1), normalize(z2)
            # a float32 queue with float64 views (gradient tests) joins them; none: the views alone, as before
            hq = None if others is None else normalize(others).to(h1.dtype)
            candidates = h2 if hq is None else torch.cat((h2, hq))
            # passed only when given: a loss of your own without the keyword keeps working
            excluding = {} if excluded is None else {"excluded": excluded}
            if self.convention == "reference":
                return self.reference(h1, candidates, **excluding)
            bias = self.logit_bias(inputs, h1)
            output = self.directional(h1, candidates, **excluding, **bias)
            if self.symmetric:  # average both directions (the h' anchors' candidates: h, then the same others)
                if excluded is not None:  # h'_i's false negatives among the h_j: the transpose; the others' unchanged
                    n = z1.shape[0]
                    excluding = {"excluded": torch.cat((excluded[:, :n].T, excluded[:, n:]), dim=1)}
                backward = self.directional(h2, h1 if hq is None else torch.cat((h1, hq)), **excluding, **bias)
                output = LossOutput(0.5 * (output.loss + backward.loss), output.stats)  # telemetry: h → h'
        return output

    def logit_bias(self, inputs: LossInputs, h1: torch.Tensor) -> dict[str, torch.Tensor]:
        """{"bias": (N, M) logits added to the candidates'} where this loss weighs some (InfoNCE's own hard
        negatives), else {} (nothing passed: `directional` as without it)."""
        return {}


def as_inputs(
    inputs: LossInputs | torch.Tensor, positives: torch.Tensor | None, roles: Mapping[str, Any]
) -> LossInputs:
    """`inputs` when it is a LossInputs (no other argument then), else LossInputs(anchors=inputs, positives=...,
    **roles), the roles given as None left out."""
    given = {role: value for role, value in roles.items() if value is not None}
    if isinstance(inputs, LossInputs):
        if positives is not None or given:
            raise TypeError("a loss takes one LossInputs, or the anchors and positives with other roles by keyword")
        return inputs
    if positives is None:
        raise TypeError("a loss takes one LossInputs, or the anchors and positives (loss(z1, z2))")
    return LossInputs(anchors=inputs, positives=positives, **given)


def registered_name(cls: type) -> str:
    """The registry name a loss class was declared under (`@part("loss", name)`), else its Python name."""
    entry = getattr(cls, "sentemb_part", None)
    return entry.name if entry is not None and entry.declared is cls else cls.__name__


def require_positive(name: str, value: float, example: str) -> float:
    """`value` if it is a finite number > 0, else a config error naming `loss.<name>`."""
    return require_number(f"loss.{name}", value, POSITIVE, f"e.g. loss.{name}={example}")


def require_finite(name: str, value: float, example: str) -> float:
    return require_number(f"loss.{name}", value, ANY, f"e.g. loss.{name}={example}")


def require_non_negative(name: str, value: float, example: str) -> float:
    return require_number(f"loss.{name}", value, NON_NEGATIVE, f"e.g. loss.{name}={example}")


def require_reference_option(name: str, value: object, allowed: Iterable[str], source: str) -> None:
    """Under `convention=reference`, `value` must be one the public code has (`allowed`)."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise SentembConfigError(
            f"loss.{name}={value!r} has no counterpart in {source} (loss.convention=reference), which has "
            f"{', '.join(map(str, allowed))}. Fix: loss.{name}={allowed[0]}, or loss.convention=paper"
        )


def require_choice(name: str, value: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise SentembConfigError(
            f"loss.{name}={value!r} is not one of {', '.join(choices)}. Fix: loss.{name}={choices[0]}"
        )
    return value


def parse_ratio(r: float | str, names: tuple[str, ...], example: str = "1.5") -> float | str:
    """A static ratio (a number > 0) or one of the named alternatives `names`."""
    if isinstance(r, str) and r in names:
        return r
    if isinstance(r, int | float) and not isinstance(r, bool):
        return require_positive("r", r, example)
    raise SentembConfigError(
        f"loss.r={r!r} must be a number > 0 (a static ratio) or one of {', '.join(names)}. Fix: e.g. loss.r={example}"
    )
