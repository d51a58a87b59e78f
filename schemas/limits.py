"""The sane bounds of event values, shared by the fold (which dead-letters events outside them) and readers."""

from __future__ import annotations

from datetime import UTC, datetime

# Every timestamp an event carries (µs since the epoch, UTC) must lie in [TS_MIN_US, TS_MAX_US).
# Fixed bounds, never relative to the wall clock, so a replay judges exactly as live did. The
# window starts at the epoch: a machine whose clock was never set reports 1970, and its evidence
# is worth keeping. Outside it a value breaks readers' arithmetic (INT64 overflow in ages, durations).
TS_MIN_US = 0  # 1970-01-01
TS_MAX_US = int(datetime(2200, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000  # 2200-01-01
TS_WINDOW = "1970-01-01..2200-01-01"

# A seq (and a seal's event_count) beyond this is no real boot's.
MAX_SEQ = 1 << 40
