"""Text a lake's catalog can hold: NUL characters written as ``\\x00`` before rows reach a lake.

DuckLake keeps each data file's min and max of every text column in its catalog, and PostgreSQL's text cannot hold
a NUL: a batch with one NUL in any text (a program's output is any bytes; a host may send anything) failed its
commit, at every start again. A file keeps the NUL as it came. Binary columns (a dead letter's key and value) are
kept byte for byte: their statistics do not reach the catalog as text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

NUL = "\x00"
SPELLED = "\\x00"  # as the agent writes the bytes it cannot keep (`\xNN`)


def _text_leaves(arr: pa.Array) -> Iterator[pa.Array]:
    """Every text array inside ``arr`` (dictionaries, lists, maps and structs opened); may include more than ``arr``'s
    slice."""
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        yield arr
    elif pa.types.is_dictionary(t):  # the fold's per-batch texts of log lines (db/foldlines.py)
        yield from _text_leaves(arr.dictionary)
    elif pa.types.is_map(t):
        yield from _text_leaves(arr.keys)
        yield from _text_leaves(arr.items)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        yield from _text_leaves(arr.flatten())
    elif pa.types.is_struct(t):
        for i in range(t.num_fields):
            yield from _text_leaves(arr.field(i))


def has_nul(table: pa.Table) -> bool:
    """Whether any text in ``table`` (nested ones included) holds a NUL. One vectorized pass per text column."""
    for column in table.columns:
        for chunk in column.chunks:
            for leaf in _text_leaves(chunk):
                if len(leaf) and pc.any(pc.match_substring(leaf, NUL)).as_py():
                    return True
    return False


def spelled(value: Any) -> Any:
    """``value`` (text, or lists, tuples and dicts of it) with every NUL written as ``\\x00``."""
    if isinstance(value, str):
        return value.replace(NUL, SPELLED)
    if isinstance(value, list):
        return [spelled(v) for v in value]
    if isinstance(value, tuple):  # a map's (key, item) pairs
        return tuple(spelled(v) for v in value)
    if isinstance(value, dict):
        return {k: spelled(v) for k, v in value.items()}
    return value


def without_nul(table: pa.Table) -> pa.Table:
    """``table`` with every NUL in its text written as ``\\x00``; the same object when there is none (the usual
    case costs one scan per text column). The rare table with one is rebuilt row by row, with its schema."""
    if not has_nul(table):
        return table
    return pa.Table.from_pylist([spelled(row) for row in table.to_pylist()], schema=table.schema)
