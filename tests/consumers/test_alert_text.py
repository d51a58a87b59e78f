"""Untrusted text in the alert channel: escaped for Slack's mrkdwn, one line; refused events aggregated per window.

No broker: the messages are built by ``alerts.message`` from rows shaped like the outbox's queries, and the
refused-event alerts by a real ``Alerter`` on a real database file whose dead letters a real ``fold`` wrote."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from flightrec.consumers.alerts import AlertConfig, Alerter, message
from flightrec.consumers.webhook import PostResult, slack_text
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.db.trust import Trust, TrustConfig
from flightrec.schemas import Lifecycle, encode
from flightrec.schemas.auth import new_fleet_key, parse_fleet_key
from materializer_helpers import Boot

HOSTILE = "bench\n<!channel> <https://evil.example|click to fix> & <!here> <@U123> *bold*\r\x1b[2J"


def _rendered(msg: dict) -> list[str]:
    """Every text Slack renders of a message: the top-level text and each block's texts."""
    out = [msg["text"]]
    for block in msg["blocks"]:
        if "text" in block:
            out.append(block["text"]["text"])
        out += [f["text"] for f in block.get("fields", ())]
    return out


@pytest.mark.parametrize("kind", ["failed", "below_min_rate", "incomplete", "lost", "refused", "failure_kind"])
def test_untrusted_text_is_escaped_for_mrkdwn_and_the_text_is_one_line(kind: str) -> None:
    row = {
        "failure_id": f"{kind}:{HOSTILE}",
        "instance_id": f"i-{HOSTILE}",
        "boot_id": "b",
        "stage": HOSTILE,
        "failure_class": HOSTILE,
        "hint": HOSTILE,
        "matched_line": HOSTILE,
        "status_detail": HOSTILE,
        "incomplete_reason": HOSTILE,
        "detail": HOSTILE,
        "refused_events": 3,
        "instances": 2,
        "examples": [HOSTILE, "i-2"],
        "ts_us": 1,
        "failure_kind": HOSTILE,  # a failure kind's alert: its kind, template and example failure ids
        "status": "new",
        "template": HOSTILE,
        "failures": 3,
        "example_failure_ids": [HOSTILE],
    }
    msg = message(kind, row, "http://dash.example:8501")
    for text in _rendered(msg):
        for control in ("<!channel>", "<!here>", "<https://evil.example|", "<@U123>", "\x1b", "\r"):
            assert control not in text, (control, text)
        assert "<" not in text and ">" not in text.replace("&gt;", ""), text
        assert "&" not in text.replace("&amp;", "").replace("&lt;", "").replace("&gt;", ""), text
    assert "\n" not in msg["text"], msg["text"]
    assert "&lt;!channel&gt;" in msg["text"] and "&amp;" in msg["text"]
    assert "\n" not in msg["blocks"][0]["text"]["text"]
    link = msg["flightrec"]["link"]
    assert " " not in link and "<" not in link and "\n" not in link, link
    assert msg["flightrec"]["instance_id"] == row["instance_id"] or kind == "refused"  # the raw value, in JSON
    if kind == "failure_kind":
        assert msg["flightrec"]["template"] == HOSTILE and "&lt;!here&gt;" in msg["text"]


def test_slack_text_is_pure_escaping() -> None:
    assert slack_text("a < b & c > d") == "a &lt; b &amp; c &gt; d"
    assert slack_text("one\ntwo\tthree\u2028four") == "one\\ntwo\\tthree\\u2028four"
    assert slack_text("plain text: ok") == "plain text: ok"


def _refusals(store: FileStore, n: int, first_offset: int, trust: Trust) -> None:
    msgs = []
    for k in range(n):
        b = Boot(instance=f"made-up-{first_offset + k}")
        ev = b.add(Lifecycle, stage="x", state="failed")
        msgs.append(RawMessage(ev.topic, 0, first_offset + k, ev.instance_id.encode(), encode(ev)))
    stats = store.commit(fold(msgs, trust=trust))
    assert stats.dead_letters == n


def test_refused_events_make_one_alert_per_window_with_the_count(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "fr.duckdb", "g")
    trust = Trust(TrustConfig(parse_fleet_key(new_fleet_key()), "refuse"))
    posted: list[dict] = []

    def post(url: str, body: bytes, key: str, timeout: float) -> PostResult:
        posted.append(json.loads(body))
        return PostResult("delivered")

    alerts = Alerter(AlertConfig("http://hook.example/x", refused_window=1.5, drain=5.0), post=post)
    try:
        alerts.start(store.con)
        _refusals(store, 300, 0, trust)  # 300 untagged events claiming 300 made-up instance ids
        alerts.sync(store.con)
        _refusals(store, 5, 300, trust)  # within the window: counted in the next one
        alerts.sync(store.con)
        rows = store.con.execute("SELECT alert_id, payload FROM alerts WHERE kind = 'refused'").fetchall()
        assert len(rows) == 1, rows
        first = json.loads(rows[0][1])["flightrec"]
        assert (first["refused_events"], first["instances"]) == (300, 300)
        time.sleep(1.6)
        alerts.sync(store.con)
        rows = store.con.execute("SELECT payload FROM alerts WHERE kind = 'refused' ORDER BY created_us").fetchall()
        assert [json.loads(r[0])["flightrec"]["refused_events"] for r in rows] == [300, 5]
        alerts.sync(store.con)  # nothing new: no alert
        assert store.con.execute("SELECT count(*) FROM alerts WHERE kind = 'refused'").fetchone() == (2,)
    finally:
        alerts.close(store.con)
        store.close()
    assert [p["flightrec"]["kind"] for p in posted] == ["refused", "refused"]
