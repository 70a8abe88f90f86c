"""Parquet: the schema's columns, read a record batch at a time; a row is named by its number (a parquet file has
no lines). pyarrow is imported only when a parquet file is read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sentemb.common.errors import SentembConfigError
from sentemb.common.parts import part
from sentemb.data.formats.base import Format, Rows


@part("data.format", "parquet")
class Parquet(Format):
    extensions = (".parquet",)
    label = "parquet"
    described = "parquet"

    def rows(self, path: Path) -> Rows:
        return parquet_rows(path)

    def row_where(self, path: Path, number: int) -> str:
        return f"{path}, row {number}"

    def header_where(self, path: Path) -> str:
        return f"{path}, schema"


def parquet_rows(path: Path) -> Rows:
    """The schema's columns, and every row with its number, read a record batch at a time (a streamed file too)."""
    import pyarrow as pa  # only where a parquet file is read: the other formats' checks run without it
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as err:  # noqa: BLE001 - pyarrow's errors are many; each is a file that is not parquet
        raise SentembConfigError(f"{path}: not a parquet file ({err}). Fix: write it with pandas/pyarrow") from err

    def rows() -> Iterator[tuple[int, dict[str, Any]]]:
        number, groups = 0, table.num_row_groups
        for group in range(groups):
            try:
                for batch in table.iter_batches(batch_size=4096, row_groups=[group]):
                    for values in batch.to_pylist():
                        number += 1
                        yield number, values
            except (OSError, ValueError, pa.ArrowException) as err:  # a corrupt page under an intact footer
                raise SentembConfigError(
                    f"{path}, row group {group + 1} of {groups} (after row {number}): the data cannot be read "
                    f"({str(err)[:200]}): the file is damaged. Fix: write it again from its source (pandas' "
                    "df.to_parquet, pyarrow's pq.write_table)"
                ) from None

    return list(table.schema_arrow.names), rows()
