"""Auxiliary terms (`auxiliary=`): a (weight, loss) term added to a step's loss, reading the views it names.

Each is an `AuxiliaryTerm` (base.py: every hook has a working default but `term`) and registers itself
(`@part("auxiliary", <name>)`); every module here is imported with the package, so a new file is found without an
import added anywhere.
"""

from sentemb.common.parts import import_parts
from sentemb.training.auxiliary.base import AuxiliaryTerm

import_parts(__name__, __path__)  # every auxiliary term registers, a new module's too

__all__ = ["AuxiliaryTerm"]
