"""Backbones and model families: the loaders (each registers itself), the family table, LoRA adapters, packing."""

from sentemb.common.parts import import_parts

import_parts(__name__, __path__)  # every loader registers, a new module's too
