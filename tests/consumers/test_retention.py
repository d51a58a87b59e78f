"""Retention by value (db/retention.py): old chatter goes, the context of every failure stays, in small steps."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from flightrec.db import retention
from flightrec.db.keep import Keep
from flightrec.schemas import Sealed
from retention_helpers import DAY, HOUR, MINUTE, NOW, Timed, write

from flightrec.settings import Settings


def texts(db: Path, instance: str) -> list[str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [r[0] for r in con.execute("SELECT text FROM log_lines WHERE instance_id = ? ORDER BY ts_us, line_no",
                                          [instance]).fetchall()]  # fmt: skip
    finally:
        con.close()


def counts(db: Path) -> dict[str, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {
            t: con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
            for t in ("log_lines", "events_seen", "failures", "process_exits", "lifecycle_events", "boots",
                      "instances", "throughput")
        }  # fmt: skip
    finally:
        con.close()


def enforce(db: Path, keep: Keep, now: int = NOW, max_events: int = 2000) -> retention.StepResult:
    """Steps until nothing is left to judge, as a materializer runs them."""
    con = duckdb.connect(str(db))
    total = retention.StepResult()
    try:
        for _ in range(10_000):
            result = retention.run_step(con, keep, now_us=now, max_events=max_events)
            total += result
            if result.done:
                return total
    finally:
        con.close()
    raise AssertionError("retention never finished")


def fleet() -> dict[str, Timed]:
    """A healthy supervisor that talked 20 days ago and yesterday; a benchmark that failed 20 days ago after a
    params stage (two hours before it, and in the 10 minutes before it); a boot lost 20 days ago."""
    old = NOW - 20 * DAY
    healthy = Timed(instance="healthy")
    healthy.started("supervisor", old)
    healthy.lines("supervisor", old + MINUTE, ["old chatter 1", "old chatter 2"])
    healthy.lines("supervisor", NOW - DAY, ["recent chatter"])

    failed = Timed(instance="failed")
    failed.started("params", old - 3 * HOUR)
    failed.lines("params", old - 2 * HOUR, ["params: long before"])
    failed.lines("params", old - 5 * MINUTE, ["params: just before"])
    failed.ended("params", old - 4 * MINUTE)
    failed.started("benchmark", old)
    failed.lines("benchmark", old + MINUTE, ["benchmark: warm-up", "CUDA error: no kernel image"])
    failed.ended("benchmark", old + 2 * MINUTE, code=1)
    failed.lines("benchmark", old + 3 * MINUTE, ["daemon: late line"])  # a late line of the failed stage
    failed.seal(old + 4 * MINUTE)

    lost = Timed(instance="lost")
    lost.started("supervisor", old - 2 * HOUR)
    lost.lines("supervisor", old - 2 * HOUR + MINUTE, ["lost: long before the end"])
    lost.lines("supervisor", old - 3 * MINUTE, ["lost: its last words"])
    return {"healthy": healthy, "failed": failed, "lost": lost}


def test_old_chatter_expires_and_the_context_of_failures_stays(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    boots = fleet()
    write(db, list(boots.values()))
    before = counts(db)
    result = enforce(db, Keep(lines_days=14))
    assert texts(db, "healthy") == ["recent chatter"]
    assert texts(db, "failed") == [
        "params: just before",  # the 10 minutes before the failed stage began
        "benchmark: warm-up",
        "CUDA error: no kernel image",
        "daemon: late line",
    ]
    assert texts(db, "lost") == ["lost: its last words"]  # the last 10 minutes of a boot that never completed
    after = counts(db)
    assert result.lines_deleted == before["log_lines"] - after["log_lines"] == 4
    # nothing else goes: the failure, its exits, lifecycle, the ledger of events (completeness is proved from it)
    assert {k: v for k, v in after.items() if k != "log_lines"} == {k: v for k, v in before.items() if k != "log_lines"}


def test_the_context_goes_after_its_own_days_and_the_failure_row_stays(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    boots = fleet()
    write(db, list(boots.values()))
    enforce(db, Keep(lines_days=14, failures_days=30))  # 20 days old: kept
    assert "CUDA error: no kernel image" in texts(db, "failed")
    enforce(db, Keep(lines_days=14, failures_days=30), now=NOW + 15 * DAY)  # 35 days old now
    assert texts(db, "failed") == [] and texts(db, "lost") == []
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute("SELECT failure_class, last_lines FROM failures WHERE instance_id = 'failed'").fetchone()
    finally:
        con.close()
    assert row is not None and "CUDA error: no kernel image" in str(row[1])  # its evidence, kept in its row


@pytest.mark.slow  # two databases and ~60 steps (~7 s)
def test_small_steps_give_what_one_big_step_gives(tmp_path: Path) -> None:
    boots = list(fleet().values())
    many = Timed(instance="chatty")
    many.started("supervisor", NOW - 30 * DAY)
    for k in range(60):
        many.lines("supervisor", NOW - 30 * DAY + k * HOUR * 12, [f"line {k}"])
    boots.append(many)
    small, big = tmp_path / "small.duckdb", tmp_path / "big.duckdb"
    write(small, boots, batch=7)
    write(big, boots)
    steps = enforce(small, Keep(lines_days=14), max_events=1)
    enforce(big, Keep(lines_days=14), max_events=100_000)
    for inst in ("healthy", "failed", "lost", "chatty"):
        assert texts(small, inst) == texts(big, inst), inst
    assert texts(big, "chatty") == [f"line {k}" for k in range(60) if k * 12 >= 16 * 24 * 1]  # 14 days and younger
    assert steps.events_judged > 30  # one event a step: the mark moved through them all


def test_the_broker_clock_judges_not_the_instance_clock(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    behind = Timed(instance="behind")  # its clock a year behind, its lines received yesterday
    behind.started("supervisor", NOW - 365 * DAY, recv=NOW - DAY)
    behind.lines("supervisor", NOW - 365 * DAY, ["said yesterday"], recv=NOW - DAY)
    behind.add(Sealed, NOW - 365 * DAY + 1, NOW - DAY, event_count=3, reason="done")
    ahead = Timed(instance="ahead")  # its clock a year ahead, its lines received 20 days ago
    ahead.started("supervisor", NOW + 365 * DAY, recv=NOW - 20 * DAY)
    ahead.lines("supervisor", NOW + 365 * DAY, ["said 20 days ago"], recv=NOW - 20 * DAY)
    ahead.add(Sealed, NOW + 365 * DAY + 1, NOW - 20 * DAY, event_count=3, reason="done")
    # (each boot sealed: the last minutes of a boot that never completed are kept as its context)
    createtime = Timed(instance="createtime")  # a CreateTime topic: no receive time, the instance's clock judges
    createtime.started("supervisor", NOW - 20 * DAY, recv=None)
    createtime.lines("supervisor", NOW - 20 * DAY, ["old by its own clock"], recv=None)
    createtime.add(Sealed, NOW - 20 * DAY + 1, None, event_count=3, reason="done")
    write(db, [behind, ahead, createtime])
    enforce(db, Keep(lines_days=14))
    assert texts(db, "behind") == ["said yesterday"]
    assert texts(db, "ahead") == []
    assert texts(db, "createtime") == []


def test_throughput_samples_become_hourly_and_results_stay(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    b = Timed(instance="prover")
    b.started("supervisor", NOW - 40 * DAY)
    hour = (NOW - 40 * DAY) // HOUR * HOUR
    for k in range(12):  # 12 samples in one old hour, 3 proofs in 10 s each
        b.sample(hour + k * 5 * MINUTE, proofs=3, seconds=10.0)
    for k in range(3):  # and 3 recent ones
        b.sample(NOW - DAY + k * MINUTE)
    write(db, [b])
    result = enforce(db, Keep(lines_days=14, samples_days=30))
    assert result.samples_merged == 11
    con = duckdb.connect(str(db), read_only=True)
    try:
        rows = con.execute(
            "SELECT ts_us < ? AS old, count(*), sum(proofs), sum(seconds), max(proofs_per_hour) FROM throughput "
            "GROUP BY ALL ORDER BY old",
            [NOW - 30 * DAY],
        ).fetchall()
    finally:
        con.close()
    assert rows == [(False, 3, 6, 30.0, 720.0), (True, 1, 36, 120.0, 1080.0)]  # the hour's totals in one row
    again = enforce(db, Keep(lines_days=14, samples_days=30))
    assert again.samples_merged == 0


def test_a_step_that_fails_leaves_nothing_half_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "f.duckdb"
    write(db, list(fleet().values()))
    before = counts(db)

    def broken(*args: object) -> None:
        raise duckdb.IOException("the disk went away")

    monkeypatch.setattr(retention, "_set_mark", broken)
    with pytest.raises(duckdb.IOException):
        enforce(db, Keep(lines_days=14))
    assert counts(db) == before  # the lines deleted before the mark failed are back
    con = duckdb.connect(str(db))
    try:
        assert retention.mark(con, "lines") is None
    finally:
        con.close()


@pytest.mark.parametrize(
    ("text", "days"), [("14", 14.0), ("0.5", 0.5), ("forever", None), ("Never", None), (" off ", None)]
)
def test_keep_settings_read_days_or_forever(text: str, days: float | None) -> None:
    settings = Settings.from_env({"FLIGHTREC_KEEP_LINES_DAYS": text})
    assert settings.keep_lines_days == days
    assert Keep.from_settings(settings).lines_days == days


@pytest.mark.parametrize("text", ["0", "-3", "nan", "inf", "two weeks"])
def test_keep_settings_refuse_what_is_not_days(text: str) -> None:
    from flightrec.errors import ConfigError

    with pytest.raises(ConfigError, match="FLIGHTREC_KEEP_LINES_DAYS"):
        Settings.from_env({"FLIGHTREC_KEEP_LINES_DAYS": text})


def test_the_defaults_keep_two_weeks_of_lines_and_failures_forever() -> None:
    keep = Keep.from_settings(Settings.from_env({}))
    assert (keep.lines_days, keep.failures_days, keep.samples_days) == (14.0, None, 30.0)
