"""Heads: parts around or in place of the pooling (SARCSE, MNTP), each registering itself (`@part("head", <name>)`)."""

from sentemb.common.parts import import_parts

import_parts(__name__, __path__)  # every head registers, a new module's too
