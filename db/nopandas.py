"""Keeps pandas out of a process that never uses it: pyarrow imports it at its first conversion otherwise."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec


class PandasKeptOut(ImportError):
    """Raised for ``import pandas`` in a process that keeps it out (pyarrow and DuckDB take it as "not installed")."""


class _Finder:
    """A ``sys.meta_path`` finder that refuses pandas and its submodules, and only them."""

    @staticmethod
    def find_spec(name: str, path: Sequence[str] | None = None, target: object = None) -> ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise PandasKeptOut(
                "pandas is kept out of this process (`flightrec materialize`, `replay` and `timeline` use Arrow "
                "and DuckDB only): run the code that needs it in a process of its own",
                name=name,
            )
        return None


def keep_pandas_out() -> bool:
    """Makes ``import pandas`` fail in this process from now on; returns False (and does nothing) if it is imported.

    Why: pyarrow imports pandas at its first conversion of Python or NumPy values (apache/arrow#34994) to recognise
    pandas' own values, whether or not the process holds any: CPU at every start, more inside a busy materializer's
    first commit, and a good part of a short `flightrec timeline` (BENCHMARKS.md, Materializer). A refused import is
    what pyarrow and DuckDB see when pandas is not installed: they convert and query as before
    (tests/cli/test_nopandas.py).
    It is an ImportError, not a FlightrecError: that is what they catch.
    """
    if "pandas" in sys.modules:
        return False
    if _Finder not in sys.meta_path:
        sys.meta_path.insert(0, _Finder)
    return True
