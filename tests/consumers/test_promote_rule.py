"""Promote a kind to a rule, end to end: failures made by the real agent, a real `flightrec materialize` running,
`flightrec rules propose --kind K --save` writing the operator's rules file (FLIGHTREC_RULES_FILE); the running
materializer picks the file up and classes exactly the kind's failures again, without a replay. A rule that fires on
a healthy line or changes an explained failure is refused with the counts; a file that does not parse leaves the
rules in use."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
from flightrec.db.classify import load_table
from flightrec.db.query import run_query
from materializer_helpers import flightrec, materialize

from flightrec.errors import LakeError, QueryError

SHARD = 'echo "zorblax: shard {n} of /data/run-{n}/p.bin unreadable at offset {m}" >&2; exit 3'
LEDGER = 'echo "zorblax ledger 0x{n:x}f turned away after {m}ms" >&2; exit 2'
OOM = 'echo "CUDA error: out of memory" >&2; exit 1'


def _run(kafka: Any, tmp_path: Path, instance: str, stage: str, script: str, code: int | None = None) -> None:
    """One stage through the real agent and its spool (``code``: the exit expected, else any failure)."""
    env = kafka.env(FLIGHTREC_SPOOL=str(tmp_path / f"spool-{instance}"), FLIGHTREC_FACTS="", FLIGHTREC_HEARTBEAT_S="0")
    r = flightrec(
        "agent", "run", "--instance", instance, "--stage", stage, "--", "sh", "-c", script, env=env, check=False
    )
    assert r.returncode == code if code is not None else r.returncode != 0, r.stderr
    assert flightrec("agent", "flush", "--timeout", "60", env=env).returncode == 0


def _rows(db: Path, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    """Read as a reader does: the running materializer's snapshot (or the file)."""
    try:
        return run_query(db, sql, params).to_pylist()
    except QueryError:  # no snapshot published yet
        return []


def _wait(what: str, check: Callable[[], Any], proc: subprocess.Popen, log: Path, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        got = check()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"waited {timeout:.0f} s for {what}\n{log.read_text()[-3000:]}")


FAILURES = """SELECT kind, failure_class, rule_id, rules_version, count(*) AS n FROM failures
WHERE instance_id LIKE ? GROUP BY ALL ORDER BY ALL"""


def _failures(db: Path, tag: str) -> list[tuple[Any, ...]]:
    return [tuple(r.values()) for r in _rows(db, FAILURES, [f"promote-{tag}-%"])]


def _start(db: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("flightrec")
    return subprocess.Popen(
        [str(exe), "materialize", "--db", str(db)],
        env={**env, "PYTHONSAFEPATH": "1"},
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def test_a_promoted_rule_reclassifies_exactly_its_kinds_failures_while_the_materializer_runs(kafka, tmp_path, env_for):
    tag = uuid.uuid4().hex[:6]
    for i in range(4):
        _run(kafka, tmp_path, f"promote-{tag}-{i}", "params", SHARD.format(n=i + 1, m=1000 + i))
        _run(kafka, tmp_path, f"promote-{tag}-{i}", "prove", LEDGER.format(n=i + 7, m=10 + i))
    rules_file = tmp_path / "operator" / "rules.toml"
    rules_file.parent.mkdir()
    db, log = tmp_path / "live.duckdb", tmp_path / "materialize.log"
    kafka.seed_at_mark(db)
    env = env_for(FLIGHTREC_RULES_FILE=str(rules_file))  # set before the file exists: no operator rule yet
    proc = _start(db, env, log)
    try:
        before = _wait("8 failures", lambda: (f := _failures(db, tag)) and sum(r[-1] for r in f) == 8 and f, proc, log)
        base = load_table().version
        assert [(c, rid, v, n) for _, c, rid, v, n in before] == [("unknown", "unknown", base, 4)] * 2, before
        shard = _rows(db, "SELECT DISTINCT kind FROM failures WHERE decisive_line LIKE '%shard%' AND instance_id "
                      "LIKE ?", [f"promote-{tag}-%"])[0]["kind"]  # fmt: skip
        out = flightrec(
            "rules", "propose", "--db", str(db), "--kind", shard[:10], "--class", "zorblax_shard", "--save", env=env
        )
        assert "failures of the kind" in out.stdout and f"saved as rule kind-{shard}" in out.stdout, out.stdout
        version = load_table(None, rules_file).version
        assert version != base

        expected = sorted(
            [(shard, "zorblax_shard", f"kind-{shard}", version, 4)]
            + [(k, "unknown", "unknown", version, 4) for k, *_ in before if k != shard]
        )
        _wait("the shard kind classed again", lambda: _failures(db, tag) == expected, proc, log)

        # a file that does not parse: refused, the promoted rule stays for the failures that come next
        rules_file.write_text(rules_file.read_text() + "\n[[rule]\nthis is not toml\n")
        _run(kafka, tmp_path, f"promote-{tag}-9", "params", SHARD.format(n=99, m=5))
        _wait("the new failure", lambda: sum(r[-1] for r in _failures(db, tag)) == 9, proc, log)
        assert (shard, "zorblax_shard", f"kind-{shard}", version, 5) in _failures(db, tag)
        refused = [line for line in log.read_text().splitlines() if "rules file is refused" in line]
        assert len(refused) == 1 and "not valid TOML" in refused[0] and version in refused[0], refused
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0, log.read_text()[-3000:]


def test_a_rule_that_matches_a_healthy_line_or_an_explained_failure_is_refused_with_the_counts(
    kafka, tmp_path, env_for
):
    tag = uuid.uuid4().hex[:6]
    for i in range(3):
        _run(kafka, tmp_path, f"promote-{tag}-{i}", "prove", LEDGER.format(n=i + 7, m=10 + i))
    # a healthy stage says what the failing ones said
    _run(kafka, tmp_path, f"promote-{tag}-h", "tunnel", LEDGER.format(n=3, m=4).replace("exit 2", "exit 0"), code=0)
    _run(kafka, tmp_path, f"promote-{tag}-o", "bench", OOM)
    db = tmp_path / "t.duckdb"
    materialize(kafka, db)
    rules_file = tmp_path / "rules.toml"
    env = env_for(FLIGHTREC_RULES_FILE=str(rules_file))
    kinds = {
        r["what"]: r["kind"]
        for r in _rows(
            db,
            "SELECT DISTINCT kind, CASE WHEN decisive_line LIKE '%ledger%' THEN 'ledger' ELSE 'oom' END AS what "
            "FROM failures",
        )
    }
    out = flightrec("rules", "propose", "--db", str(db), "--kind", kinds["ledger"], "--save", env=env, check=False)
    assert out.returncode == 3, out.stdout + out.stderr
    counts = _counts(out.stdout)
    assert counts["failures of the kind"] == 3 and counts["matched inside the kind"] == 3, out.stdout
    assert counts["healthy lines matched (must be 0)"] == 1, out.stdout
    assert "refused: it matches 1 healthy line(s)" in out.stdout
    out = flightrec(
        "rules", "propose", "--db", str(db), "--kind", kinds["oom"], "--class", "mine", "--save", env=env, check=False
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert _counts(out.stdout)["explained failures it would change (must be 0)"] == 1, out.stdout
    assert "refused: it would change the class of 1 failure(s) a rule already explains" in out.stdout
    assert not rules_file.exists()


def _counts(table: str) -> dict[str, int]:
    """The backtest's rows of `rules propose`'s table: name -> count."""
    rows = table.split("BACKTEST", 1)[1].splitlines()[1:]
    return {name.strip(): int(n) for name, _, n in (r.rpartition("  ") for r in rows if r[-1:].isdigit())}


def _lake_failures(db: str, data_path: str, tag: str) -> list[tuple[Any, ...]]:
    from lake_helpers import lake_con

    try:
        con = lake_con(db, data_path)
    except LakeError:  # the members have not made the lake yet
        return []
    try:
        return [tuple(r) for r in con.execute(FAILURES, [f"promote-{tag}-%"]).fetchall()]
    except duckdb.CatalogException:  # nor its tables
        return []
    finally:
        con.close()


def _start_member(db: str, data_path: str, group: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    exe = Path(sys.executable).with_name("flightrec")
    return subprocess.Popen(
        [str(exe), "materialize", "--db", db, "--data-path", data_path, "--group", group],
        env={**env, "PYTHONSAFEPATH": "1", "FLIGHTREC_LOG_LEVEL": "INFO"},
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
    )


def test_a_promoted_rule_reclassifies_its_kinds_failures_in_a_running_lake_group(kafka, lake, tmp_path, env_for):
    """Two members of a lake group running: each watches the operator's rules file and classes again the stored
    failures of the shards it owns; a file that does not parse is refused by each with one line, the rules stay."""
    from lake_helpers import seed_lake_at_mark

    db, data_path = lake
    tag = uuid.uuid4().hex[:6]
    for i in range(6):
        _run(kafka, tmp_path, f"promote-{tag}-{i}", "params", SHARD.format(n=i + 1, m=1000 + i))
        _run(kafka, tmp_path, f"promote-{tag}-{i}", "prove", LEDGER.format(n=i + 7, m=10 + i))
    group = f"lake-{uuid.uuid4().hex[:8]}"
    seed_lake_at_mark(kafka, db, data_path, group)  # the members start at the mark, not at earlier tests' failures
    rules_file = tmp_path / "operator" / "rules.toml"
    rules_file.parent.mkdir()
    env = env_for(FLIGHTREC_RULES_FILE=str(rules_file))
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [_start_member(db, data_path, group, env, log) for log in logs]

    def waited(what: str, check: Callable[[], Any], timeout: float = 150) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p, log in zip(procs, logs, strict=True):
                assert p.poll() is None, log.read_text()[-3000:]
            got = check()
            if got:
                return got
            time.sleep(0.5)
        raise AssertionError(f"waited {timeout:.0f} s for {what}\n" + "\n".join(g.read_text()[-3000:] for g in logs))

    def failures() -> list[tuple[Any, ...]]:
        return _lake_failures(db, data_path, tag)

    try:
        before = waited("12 failures", lambda: (f := failures()) and sum(r[-1] for r in f) == 12 and f)
        base = load_table().version
        assert [(c, rid, v, n) for _, c, rid, v, n in before] == [("unknown", "unknown", base, 6)] * 2, before
        owners = waited("both members owning shards", lambda: _owners(db, data_path, group) == 2)
        assert owners
        shard = next(k for k, *_ in before if k in _kinds_of(db, data_path, tag, "%shard%"))
        out = flightrec(
            "rules", "propose", "--db", db, "--data-path", data_path, "--kind", shard, "--class", "zorblax_shard",
            "--save", env=env,
        )  # fmt: skip
        assert f"saved as rule kind-{shard}" in out.stdout, out.stdout
        version = load_table(None, rules_file).version
        assert version != base
        expected = sorted(
            [(shard, "zorblax_shard", f"kind-{shard}", version, 6)]
            + [(k, "unknown", "unknown", version, 6) for k, *_ in before if k != shard]
        )
        waited("the shard kind classed again", lambda: failures() == expected)

        # a file that does not parse: refused by each member once, the promoted rule stays for what comes next
        rules_file.write_text(rules_file.read_text() + "\n[[rule]\nthis is not toml\n")
        _run(kafka, tmp_path, f"promote-{tag}-9", "params", SHARD.format(n=99, m=5))
        waited("the new failure", lambda: sum(r[-1] for r in failures()) == 13)
        assert (shard, "zorblax_shard", f"kind-{shard}", version, 7) in failures()
        time.sleep(2.0)  # each member's next look at the file (once a second)
        for log in logs:
            refused = [line for line in log.read_text().splitlines() if "rules file is refused" in line]
            assert len(refused) == 1 and "not valid TOML" in refused[0] and version in refused[0], refused
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(g.read_text()[-3000:] for g in logs)


def _owners(db: str, data_path: str, group: str) -> int:
    """How many members own shards of the lake (the seed's claims left aside)."""
    from lake_helpers import lake_count

    return lake_count(db, "SELECT count(DISTINCT owner) FROM claims WHERE owner <> 'seed'", None, data_path)


def _kinds_of(db: str, data_path: str, tag: str, like: str) -> set[str]:
    from lake_helpers import lake_con

    con = lake_con(db, data_path)
    try:
        sql = "SELECT DISTINCT kind FROM failures WHERE decisive_line LIKE ? AND instance_id LIKE ?"
        return {r[0] for r in con.execute(sql, [like, f"promote-{tag}-%"]).fetchall()}
    finally:
        con.close()


def test_a_lake_member_fenced_while_classing_again_writes_nothing_and_the_next_owner_classes_the_shard(
    kafka, lake, tmp_path, env_for
):
    """A member whose shards were claimed away (the group's coordinator not told) is fenced at its first step of
    classing again: it writes nothing and drops the shard; the members that claim the shards then class them."""
    from lake_helpers import seed_lake_at_mark
    from materializer_helpers import publish

    db, data_path = lake
    tag = uuid.uuid4().hex[:6]
    boots = [_zorblax_boot(f"promote-{tag}-{n}", n) for n in range(4)]
    group = f"lake-{uuid.uuid4().hex[:8]}"
    seed_lake_at_mark(kafka, db, data_path, group)
    publish(kafka.bootstrap, [e for b in boots for e in b.events])
    rules_file = tmp_path / "rules.toml"
    env = env_for(FLIGHTREC_RULES_FILE=str(rules_file))
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [_start_member(db, data_path, group, env, logs[0])]

    def waited(what: str, check: Callable[[], Any], timeout: float = 150) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p, log in zip(procs, logs, strict=False):
                assert p.poll() is None, log.read_text()[-3000:]
            if got := check():
                return got
            time.sleep(0.5)
        raise AssertionError(f"waited {timeout:.0f} s for {what}\n" + "\n".join(g.read_text()[-3000:] for g in logs))

    def failures() -> list[tuple[Any, ...]]:
        return [r[1:] for r in _lake_failures(db, data_path, tag)]

    base = load_table().version
    try:
        waited("4 failures", lambda: failures() == [("unknown", "unknown", base, 4)])
        _claim_every_shard(db, data_path, group)  # the group's coordinator knows nothing of it
        rules_file.write_text('[[rule]]\nid = "zorblax"\nclass = "zorblax_shard"\nhint = "h"\nlines = ["zorblax"]\n')
        waited("member a fenced", lambda: "were claimed by another member" in logs[0].read_text())
        time.sleep(3.0)  # a's further steps, had it gone on writing
        assert failures() == [("unknown", "unknown", base, 4)], "a fenced member wrote"
        procs.append(_start_member(db, data_path, group, env, logs[1]))  # the group rebalances: a and b claim anew
        version = load_table(None, rules_file).version
        waited("the shards classed again", lambda: failures() == [("zorblax_shard", "zorblax", version, 4)])
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(g.read_text()[-3000:] for g in logs)


def _zorblax_boot(instance: str, n: int) -> Any:
    """A boot whose stage fails with a line no packaged rule knows."""
    from flightrec.schemas import Lifecycle
    from materializer_helpers import Boot

    b = Boot(instance=instance)
    said = [f"zorblax: shard {n} unreadable"]
    b.add(Lifecycle, stage="params", state="started")
    b.lines("params", "stderr", said)
    b.exit("params", 3, stderr=said)
    b.add(Lifecycle, stage="params", state="failed", detail="params exited 3")
    return b


def _claim_every_shard(db: str, data_path: str, group: str) -> None:
    """Every shard of the lake claimed by an owner outside the group (as a member that the group has not heard of)."""
    from flightrec.db import lake as lakes
    from flightrec.db.lakestore import LakeStore
    from lake_helpers import lake_con

    con = lake_con(db, data_path)
    try:
        shards = [r[0] for r in con.execute("SELECT DISTINCT shard FROM claims ORDER BY 1").fetchall()]
    finally:
        con.close()
    thief = LakeStore(lakes.lake_location(db, data_path, writing=True), group, shards=shards, owner="thief")
    try:
        thief.claim(shards)
    finally:
        thief.close()
