"""Hypothesis strategies for the wire tests: LogBatch events of every shape the schema allows."""

from __future__ import annotations

from flightrec.schemas import LogBatch
from hypothesis import strategies as st

longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@st.composite
def batches(draw):
    n = draw(st.integers(min_value=0, max_value=40))
    text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)
    return LogBatch(
        event_id=draw(st.text(max_size=40)),
        instance_id=draw(st.text(max_size=20)),
        boot_id=draw(st.text(max_size=40)),
        seq=draw(longs),
        ts_us=draw(longs),
        stage=draw(st.text(max_size=10)),
        source=draw(st.text(max_size=30)),
        pid=draw(st.integers(min_value=-(2**31), max_value=2**31 - 1)),
        line_no=draw(st.lists(longs, min_size=n, max_size=n)),
        line_ts_us=draw(st.lists(longs, min_size=n, max_size=n)),
        text=draw(st.lists(text, min_size=n, max_size=n)),
        truncated=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        invalid_utf8=draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        late=draw(st.one_of(st.just(()), st.lists(st.booleans(), min_size=n, max_size=n))),
    )
