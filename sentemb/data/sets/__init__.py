"""Where labelled rows come from (`data.set` parts, named by data.source): a file of your own or a built-in set.

Each is a `LabelledSource` (base.py) with `@part("data.set", "<name>")`, declaring its reader, whether it streams,
its columns and its in-domain test set; conf/data/<name>.yaml sets data.source=<name> and its default data.path.
Every module here is imported with the package, so a new set is its module and its yaml: no import added anywhere.
"""

from sentemb.common.parts import import_parts
from sentemb.data.sets.base import FileSource, LabelledSource, TabSeparatedSet

import_parts(__name__, __path__)  # every set registers, a new module's too

__all__ = ["FileSource", "LabelledSource", "TabSeparatedSet"]
