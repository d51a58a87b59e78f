"""The materializer: consume the four topics into the database (flightrec.db) exactly once; the destroy gate, alerts,
the timeline."""
