"""What a maker of an extra view declares (`ViewMaker`): each sentence's text of its view, and the anchor's sentences.

A maker is built from the options of the training part that asks for its view (`from_options`); it holds those
options only (a frozen dataclass: datasets' cache of the tokenised corpus is keyed by it), never per-batch state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ViewMaker:
    """Makes one extra view of every sentence: `texts` (the view's sentence for each), tokenised and padded on its
    own under its role's prefix (sentemb.common.batch_views.prefix)."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> ViewMaker | None:
        """The maker from the asking part's options (None: no options, no view)."""
        return cls(**options) if options else None

    def anchors(self, sentences: list[str]) -> list[str]:
        """The sentences the anchor view (and the positive made from it) is made of: as given, unless the view's
        method reads them its own way."""
        return sentences

    def texts(self, sentences: list[str]) -> list[str]:
        """The view's text of each sentence, in order."""
        raise NotImplementedError(f"{type(self).__name__}.texts")
