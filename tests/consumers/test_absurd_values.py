"""One absurd value never breaks the fleet: the fold dead-letters it, and readers format whatever is stored."""

from __future__ import annotations

import dataclasses

from flightrec.analytics import queries
from flightrec.db.fold import RawMessage, fold
from flightrec.db.query import run_query
from flightrec.db.views import VIEWS
from flightrec.schemas import Lifecycle, encode
from materializer_helpers import Boot, flightrec, materialize, publish

ABSURD = -(2**63) + 5


def _no_traceback(out) -> None:
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 0, out.stderr


def test_the_fold_dead_letters_absurd_envelopes():
    b = Boot()
    b.add(Lifecycle, stage="tunnel", state="started")
    good = b.events[-1]
    bad = [
        dataclasses.replace(good, event_id=f"bad-{i}", **change)
        for i, change in enumerate([{"ts_us": ABSURD}, {"ts_us": 2**62}, {"ts_us": -1}, {"seq": 2**62}])
    ]
    b.lines("tunnel", "stdout", ["x"])
    lines = b.events[-1]
    bad.append(dataclasses.replace(lines, event_id="bad-line", line_ts_us=[ABSURD]))
    b.exit("tunnel", 0)
    bad.append(dataclasses.replace(b.events[-1], event_id="bad-exit", ended_us=ABSURD))
    msgs = [RawMessage(e.topic, 0, i, e.instance_id.encode(), encode(e)) for i, e in enumerate([good, *bad])]
    delta = fold(msgs)
    assert delta.events.column("event_id").to_pylist() == [good.event_id]
    reasons = delta.dead.column("reason").to_pylist()
    assert len(reasons) == len(bad)
    assert all("outside" in r or "beyond" in r for r in reasons), reasons
    assert "ts_us" in reasons[0] and "seq" in reasons[3] and "line_ts_us" in reasons[4] and "ended_us" in reasons[5]
    # Deterministic: the same messages give the same dead letters, whatever the wall clock.
    assert fold(msgs).dead.equals(delta.dead)


def test_one_absurd_timestamp_through_the_broker_breaks_nothing(kafka, db, env_for):
    b = Boot()
    b.facts()
    b.add(Lifecycle, stage="tunnel", state="started")
    b.lines("tunnel", "stdout", ["up"])
    b.add(Lifecycle, stage="tunnel", state="succeeded")
    evil = dataclasses.replace(b.events[1], event_id="evil-" + b.instance, ts_us=ABSURD)
    other = Boot()
    other.stage_ok("register", ["ok"])
    publish(kafka.bootstrap, b.events + [evil] + other.events)
    materialize(kafka, db, idle=0.5)

    dead = run_query(db, "SELECT reason FROM dead_letters WHERE key = ?", [b.instance.encode()]).to_pylist()
    assert len(dead) == 1 and "ts_us" in dead[0]["reason"]
    fleet = run_query(db, "SELECT * FROM fleet", prelude=VIEWS)
    assert {b.instance, other.instance} <= set(fleet.column("instance_id").to_pylist())
    assert queries.fleet_table(db).num_rows >= 2
    env = env_for()
    for sql in ("SELECT * FROM fleet", f"SELECT * FROM stage_runs WHERE instance_id = '{b.instance}'"):
        _no_traceback(flightrec("sql", "--db", str(db), sql, env=env, check=False))
    _no_traceback(flightrec("timeline", b.instance, "--db", str(db), env=env, check=False))


def test_readers_format_absurd_values_already_stored(db, env_for):
    # A database written before the fold validated envelopes (or by another tool) may hold them.
    from flightrec.db.filestore import FileStore

    store = FileStore(db, "g")
    try:
        store.con.execute(
            "INSERT INTO instances (instance_id, state, first_event_us, last_event_us) "
            "VALUES ('i-old', 'started', ?, ?)",
            [ABSURD, 2**62],
        )
        store.con.execute(
            "INSERT INTO lifecycle_events (event_id, instance_id, boot_id, seq, ts_us, kind, stage, state) "
            "VALUES ('e1', 'i-old', 'b', 0, ?, 'lifecycle', 'tunnel', 'started'), "
            "('e2', 'i-old', 'b', 1, ?, 'lifecycle', 'tunnel', 'failed')",
            [ABSURD, 2**62],
        )
        store.con.execute(
            "INSERT INTO log_lines (instance_id, boot_id, event_id, seq, stage, source, line_no, ts_us, text) "
            "VALUES ('i-old', 'b', 'e3', 2, 'tunnel', 'stdout', 1, ?, 'a line')",
            [ABSURD],
        )
        store.con.execute(
            "INSERT INTO process_exits (event_id, instance_id, boot_id, seq, ts_us, stage, exit_code, "
            "started_us, ended_us, duration_s) VALUES ('e4', 'i-old', 'b', 3, ?, 'tunnel', 1, ?, ?, 1e300)",
            [2**62, ABSURD, 2**62],
        )
    finally:
        store.close()
    for view in ("fleet", "stage_runs", "log_view", "failure_context", "throughput_samples"):
        run_query(db, f"SELECT * FROM {view}", prelude=VIEWS)
    queries.fleet_table(db)
    queries.fleet_counts(db)
    env = env_for()
    for sql in (
        "SELECT * FROM fleet",
        "SELECT * FROM stage_runs",
        "SELECT * FROM log_view",
        "SELECT TIMESTAMP '20000-01-01 00:00:00' AS far, DATE '-5000-01-01' AS early",
    ):
        for fmt in ((), ("--json",), ("--csv",)):
            _no_traceback(flightrec("sql", "--db", str(db), *fmt, sql, env=env, check=False))
    out = flightrec("timeline", "i-old", "--db", str(db), env=env, check=False)
    _no_traceback(out)
    assert "a line" in out.stdout
