"""The materializer: decode the four topics, fold events into DuckDB tables exactly once, serve live reads."""
