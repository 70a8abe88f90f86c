"""The auxiliary-term protocol: a part that adds weight · loss to a training step, from the views it reads.

A run configures any number of terms, in order (`auxiliary=[sncse,my_term]`; each conf/auxiliary/<name>.yaml is
packaged under its name, `# @package auxiliary.<name>`, so its fields are `auxiliary.<name>.<field>`). A term declares
the views it reads by role (`reads`: e.g. a negation, a hard negative; the anchor and positive are always there) and,
for a view the data must make, how (`data_views`: role → the options the data's maker of that view reads,
sentemb.data.views). Before any model loads each term's `reads` is checked against the views the data makes, its
`check_config` gets the run's config (its data config included), and its `label` must be its own: not another term's,
nor the pooling's or head's own terms' (HiCL's local loss, SARCSE's reconstruction, DiffCSE's replaced-token
detection, MNTP), nor `global`. Each step the module hands it the step's `TrainingViews` cut to the rows that have
every view it reads (a built-in set's missing hard negative is never seen) and sums what `term` returns with the
pooling's and head's own terms, each logged as train/loss/<label>. Terms are per rank, like every auxiliary term:
DDP's average of the ranks' gradients makes them the global mean. A term keeps no per-batch state.

A new term subclasses `AuxiliaryTerm`, registers with `@part("auxiliary", "<name>")` in a module of this package (or
`register_part` from your own code), and writes `term` (and whatever else it changes), with its yaml.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from sentemb.encoders.poolings.base import TrainingViews


class AuxiliaryTerm(nn.Module):
    """An `auxiliary=` part (module docstring)."""

    label = "auxiliary"  # its logged name, train/loss/<label>: its own, checked before any model loads
    reads: tuple[str, ...] = ()  # the roles of the views beyond the anchor and positive that `term` reads

    def check_config(self, cfg: Mapping[str, Any]) -> None:
        """What the term cannot go with in the run's config `cfg` (the loss, pooling, model, trainer and data
        configs) and its sources, before any model loads; its options are its constructor's. Nothing by default."""

    def data_views(self) -> dict[str, dict[str, Any]]:
        """The views the data makes for this term: role → the options its maker reads. None by default."""
        return {}

    def term(self, views: TrainingViews) -> tuple[float, torch.Tensor]:
        """(weight, loss) of this step's views (a view it reads: `views.view(role, asked_by=...)`)."""
        raise NotImplementedError(f"{type(self).__name__} defines no term(views)")
