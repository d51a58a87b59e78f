"""A fold's log lines gathered as columns: each LogBatch's per-line arrays appended, one Arrow table at the end."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from flightrec.schemas.arrow import element_field, event_fields

LOGS = pa.schema(
    event_fields("LogBatch", "instance_id", "boot_id", "event_id", "seq", "stage", "source", "pid")
    + [element_field("LogBatch", "line_no"), element_field("LogBatch", "line_ts_us", "ts_us")]
    + [element_field("LogBatch", n) for n in ("text", "truncated", "invalid_utf8", "late")]
)
_PER_BATCH_TEXT = ("instance_id", "boot_id", "event_id", "stage", "source")
# LOGS as the fold gives it: a LogBatch's own texts dictionary-encoded (one value per batch, an index per line)
LOGS_FOLDED = pa.schema(
    [f.with_type(pa.dictionary(pa.int32(), f.type)) if f.name in _PER_BATCH_TEXT else f for f in LOGS]
)
_PER_BATCH = (*_PER_BATCH_TEXT, "seq", "pid")
_LINE_COLUMNS = ("line_no", "ts_us", "truncated", "invalid_utf8", "late")  # a LogBatch's numeric per-line arrays


class LogLines:
    """The lines of a fold's LogBatches, in the order added.

    Large batches come decoded as columns (schemas/logcolumns.py: numpy arrays, the texts an Arrow array) and are kept
    as they are; the lines of the small batches between them are gathered in lists.
    """

    def __init__(self) -> None:
        self.per_batch: dict[str, list[Any]] = {k: [] for k in _PER_BATCH}
        self.counts: list[int] = []
        self.texts: list[Any] = []  # Arrow arrays and lists
        self.columns: dict[str, list[Any]] = {k: [] for k in _LINE_COLUMNS}  # numpy arrays and lists

    def add(self, rec: dict[str, Any], n: int, late: Any) -> None:
        """One LogBatch record of ``n`` lines (its arrays checked to be as long) and its ``late`` flags."""
        for k, values in self.per_batch.items():
            values.append(rec[k])
        self.counts.append(n)
        _append(self.texts, rec["text"], pa.Array)
        for k, values in zip(
            _LINE_COLUMNS, (rec["line_no"], rec["line_ts_us"], rec["truncated"], rec["invalid_utf8"], late), strict=True
        ):
            _append(self.columns[k], values, np.ndarray)

    def table(self) -> pa.Table:
        """The lines' table (LOGS_FOLDED); a batch's texts (instance, boot, event, stage, source) are dictionary
        encoded, one value per LogBatch: not copied once per line (DuckDB inserts them as fast)."""
        idx = pa.array(np.repeat(np.arange(len(self.counts), dtype=np.int32), np.asarray(self.counts, dtype=np.int64)))
        arrays = []
        for f in LOGS:
            if f.name in self.per_batch:
                values = pa.array(self.per_batch[f.name], type=f.type)
                arrays.append(
                    pa.DictionaryArray.from_arrays(idx, values) if f.name in _PER_BATCH_TEXT else values.take(idx)
                )
            elif f.name == "text":
                arrays.append(_joined_texts(self.texts, f.type))
            else:
                pieces = self.columns[f.name]
                dtype = np.bool_ if pa.types.is_boolean(f.type) else np.int64
                column = np.concatenate([np.asarray(p, dtype=dtype) for p in pieces]) if pieces else np.zeros(0, dtype)
                arrays.append(pa.array(column, type=f.type))
        return pa.Table.from_arrays(arrays, schema=LOGS_FOLDED)


def _append(pieces: list[Any], values: Any, whole: type) -> None:
    """A batch's values: a ``whole`` column is kept as a piece, others extend the list piece at the end."""
    if isinstance(values, whole):
        pieces.append(values)
    elif pieces and isinstance(pieces[-1], list):
        pieces[-1].extend(values)
    else:
        pieces.append(list(values))


def _joined_texts(pieces: list[Any], type_: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """One array of the pieces' texts (Arrow arrays and lists); chunked where they exceed one array's 2 GiB."""
    column = pa.chunked_array([p if isinstance(p, pa.Array) else pa.array(p, type=type_) for p in pieces], type=type_)
    return column.combine_chunks() if column.nbytes < 1 << 31 else column
