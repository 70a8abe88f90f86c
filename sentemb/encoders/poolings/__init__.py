"""Poolings: the interface (base.py) and every pooling, each registering itself (`@part("pooling", <name>)`)."""

from sentemb.common.parts import import_parts

import_parts(__name__, __path__)  # every pooling registers, a new module's too
