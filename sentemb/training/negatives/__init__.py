"""Negatives parts (`negatives=`): extra negatives for the global loss, and false negatives left out of it.

Each part is a `NegativesPart` (base.py: every hook has a working default) and registers itself
(`@part("negatives", <name>)`); every module here is imported with the package, so a new file is found without an
import added anywhere.
"""

from sentemb.common.parts import import_parts
from sentemb.training.negatives.base import NegativesPart, StepInputs, StepNegatives

import_parts(__name__, __path__)  # every negatives part registers, a new module's too

__all__ = ["NegativesPart", "StepInputs", "StepNegatives"]
