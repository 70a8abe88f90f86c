"""Makers of the extra views training parts ask for (`data.view` parts, named by the view's role).

Each is a `ViewMaker` (base.py) with `@part("data.view", "<role>")`, built from the options of the part that asks
for its view (`AuxiliaryTerm.data_views`: role → options); sentemb.data.views makes and pads the views. Every module
here is imported with the package, so a new maker is its one module: no import added anywhere.
"""

from sentemb.common.parts import import_parts
from sentemb.data.view_makers.base import ViewMaker

import_parts(__name__, __path__)  # every view maker registers, a new module's too

__all__ = ["ViewMaker"]
