"""The `negation` view: each sentence's negation (SNCSE's margin term reads it, `auxiliary=sncse`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sentemb.common.parts import part
from sentemb.data.view_makers.base import ViewMaker

NEGATION = "negation"  # the view's role


@part("data.view", NEGATION)
@dataclass(frozen=True)
class NegationView(ViewMaker):
    """Where each sentence's negation comes from (`sentemb.data.negation.negate_sentences`: source, path,
    lookup_quirk, spacy_model), and under `convention=reference` the released training's sentences (`anchors`) and
    lookup (`lookup_quirk`, unless set). `stamp`: the negation file's size and mtime, so datasets' cache of the
    tokenised corpus (keyed by the mapped function and its arguments) is not reused once the file changed."""

    source: str
    path: str | None = None
    lookup_quirk: bool = False
    spacy_model: str = "en_core_web_sm"
    stamp: tuple[int, int] | None = None
    convention: str = "paper"

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> NegationView | None:
        """None when the options are absent (null); the asking part's other options (alpha, beta, weight, ...) are
        not read here."""
        if not options:
            return None
        path = options.get("path")
        path = None if path is None else os.path.expanduser(str(path))
        stamp = None
        if path is not None and os.path.isfile(path):
            status = os.stat(path)
            stamp = (status.st_size, status.st_mtime_ns)
        convention = options.get("convention") or "paper"
        quirk = options.get("lookup_quirk")  # null: the convention's (the released lookup under reference)
        return cls(
            source=options.get("source"),
            path=path,
            lookup_quirk=convention == "reference" if quirk is None else bool(quirk),
            spacy_model=options.get("spacy_model") or "en_core_web_sm",
            stamp=stamp,
            convention=convention,
        )

    def anchors(self, sentences: list[str]) -> list[str]:
        """The sentences the anchor view is made of: as given (`paper`), or as SNCSE's training reads them
        (`reference`: `with_final_period`, for its anchor's and positive's prompts alike)."""
        if self.convention != "reference":
            return sentences
        from sentemb.data.negation import with_final_period

        return [with_final_period(sentence) for sentence in sentences]

    def texts(self, sentences: list[str]) -> list[str]:
        from sentemb.data.negation import negate_sentences  # the negation parser (spaCy) loads only when used

        return negate_sentences(
            sentences, self.source, path=self.path, lookup_quirk=self.lookup_quirk, spacy_model=self.spacy_model
        )
