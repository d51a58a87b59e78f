"""A failed stage's last lines, kept in its failures row: read from log_lines once, then merged with each commit's."""

from __future__ import annotations

import logging

import duckdb
import pyarrow as pa
from flightrec.db.arrowviews import arrow_views
from flightrec.db.fold import I64, STR

log = logging.getLogger(__name__)

# one of a failed stage's last lines, kept in its failures row: where it stands among the stage's lines, its source
LAST_LINES_TYPE = pa.list_(pa.struct([("seq", I64), ("line_no", I64), ("source", STR), ("text", STR)]))

LAST_LINES = 50  # a failed stage's last lines (all its sources, in order), kept in its failures row: the evidence

# The last {n} lines of each stage of {keys}, oldest first: a top-n per stage (a heap, no sort of a chatty stage's
# lines). {lines} is where they are read: log_lines (a scan), or the stored ones and the commit's new ones (below).
_LAST_SQL = """
SELECT instance_id, boot_id, stage,
       list_reverse(max_by(line, {{'seq': line.seq, 'line_no': line.line_no}}, {n})) AS last_lines
FROM (SELECT instance_id, boot_id, stage, {{'seq': seq, 'line_no': line_no, 'source': source, 'text': text}} AS line
      FROM {lines} SEMI JOIN {keys} USING (instance_id, boot_id, stage))
GROUP BY ALL"""
# A stage whose failures row holds its last lines already, and got new lines in this commit: the last lines of those
# two (lines only ever come in, so these are the last of all; a redelivered event is not among the new ones).
_MERGED_LINES = """(
    SELECT instance_id, boot_id, stage, u.line.seq AS seq, u.line.line_no AS line_no, u.line.source AS source,
           u.line.text AS text
    FROM (SELECT instance_id, boot_id, stage, unnest(last_lines) AS line FROM failures
          SEMI JOIN _last_merged USING (instance_id, boot_id, stage)) u
    UNION ALL
    SELECT instance_id, boot_id, stage, seq, line_no, source, text FROM {new_lines})"""


def last_lines(con: duckdb.DuckDBPyConnection, new_lines: str | None) -> pa.Table:
    """The last lines of each stage of ``_fail_keys`` (instance_id, boot_id, stage, last_lines). ``new_lines``, a
    relation of the commit's newly stored lines (None: unknown), lets a stage whose failures row holds its last lines
    already merge those with its new ones; the others (a new failure, a rebuild, a lake member's kept failures, which
    hold keys only) read log_lines, once for all of them."""
    merged = pa.table({"instance_id": pa.array([], STR), "boot_id": pa.array([], STR), "stage": pa.array([], STR)})
    if new_lines is not None and "last_lines" in {c[0] for c in con.sql("SELECT * FROM failures LIMIT 0").description}:
        merged = con.sql("""SELECT instance_id, boot_id, stage FROM failures
                            SEMI JOIN _fail_keys USING (instance_id, boot_id, stage)
                            WHERE last_lines IS NOT NULL""").to_arrow_table()
    parts = []
    with arrow_views(con, _last_merged=merged):
        if merged.num_rows:
            lines = _MERGED_LINES.format(new_lines=new_lines)
            parts.append(con.sql(_LAST_SQL.format(lines=lines, keys="_last_merged", n=LAST_LINES)).to_arrow_table())
        scanned = con.sql(
            "SELECT * FROM _fail_keys ANTI JOIN _last_merged USING (instance_id, boot_id, stage)"
        ).to_arrow_table()
    if scanned.num_rows:  # only for them: a scan of log_lines is the cost this spares
        log.debug("last lines of %d failed stages read from log_lines", scanned.num_rows)
        with arrow_views(con, _last_scanned=scanned):
            parts.append(
                con.sql(_LAST_SQL.format(lines="log_lines", keys="_last_scanned", n=LAST_LINES)).to_arrow_table()
            )
    return pa.concat_tables(parts) if parts else pa.table({"instance_id": pa.array([], STR)}).slice(0, 0)
