"""File formats of labelled data (`data.format` parts), each picked by a file's extension (`file_format`).

Each format is a `Format` (base.py) with `@part("data.format", "<name>")`: its extensions and its row reader. Every
module here is imported with the package, so a new format is its one module: no yaml (no config names a format:
the file's extension picks it) and no import added anywhere.
"""

from sentemb.common.parts import import_parts
from sentemb.data.formats.base import Format, Rows, extensions, file_format, format_of

import_parts(__name__, __path__)  # every format registers, a new module's too

__all__ = ["Format", "Rows", "extensions", "file_format", "format_of"]
