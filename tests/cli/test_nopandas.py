"""keep_pandas_out: pandas refused in a process, pyarrow and DuckDB working as where pandas is not installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, check=False
    )


def test_pyarrow_and_duckdb_convert_and_query_without_importing_pandas():
    r = _python(
        """
        import sys
        from flightrec.db.nopandas import PandasKeptOut, keep_pandas_out
        assert keep_pandas_out()
        import duckdb, numpy as np, pyarrow as pa
        t = pa.Table.from_pydict({"text": ["a", None, "é"], "n": np.arange(3)})
        t = t.append_column("k", pa.array(["x", "y"]).take(pa.array([0, 1, 1])))
        con = duckdb.connect()
        con.register("t", t)
        assert con.execute("SELECT string_agg(text, ','), sum(n), string_agg(k, '') FROM t").fetchall() == [
            ("a,é", 3, "xyy")
        ]
        assert con.execute("SELECT * FROM t ORDER BY n").fetch_arrow_table().equals(t)
        assert "pandas" not in sys.modules, "a conversion imported pandas"
        try:
            import pandas
        except PandasKeptOut as exc:
            assert "kept out of this process" in str(exc), exc
        else:
            raise AssertionError("pandas was imported")
        try:
            con.execute("SELECT 1").df()
        except duckdb.Error as exc:
            assert "pandas" in str(exc), exc
        else:
            raise AssertionError("DuckDB made a DataFrame")
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_a_process_that_already_holds_pandas_keeps_it():
    r = _python(
        """
        import pandas
        from flightrec.db.nopandas import keep_pandas_out
        assert not keep_pandas_out()
        import pandas.api.types  # still importable: nothing was installed
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
