"""Failure kinds end to end: failures made by the real agent (`flightrec agent run`), folded by the real
materializer, become kinds (failures.kind, the failure_kinds view, `flightrec kinds`); a replay gives the same."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

import duckdb
from flightrec.db.views import prelude_for
from materializer_helpers import flightrec, materialize

# Three kinds no rule knows, each with its own variable parts: numbers, a path, an address, a hex value, a duration.
SCRIPTS = {
    "params": 'echo "zorblax: shard {n} of /data/run-{n}/p.bin unreadable at offset {m}" >&2; exit 3',
    "bench-{i}": 'echo "zorblax quorum gone: peer 10.0.{i}.9:70{i} answered {m} frames" >&2; exit 1',
    "prove": 'echo "zorblax ledger 0x{h:x} turned away after {m}ms" >&2; exit 2',
}
KINDS_SQL = "SELECT kind, template, status, failures, instances FROM failure_kinds WHERE template LIKE '%zorblax%'"


def _kinds(db: Path) -> list[tuple[Any, ...]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        for stmt in prelude_for(KINDS_SQL):
            con.execute(stmt)
        return sorted(con.execute(KINDS_SQL).fetchall())
    finally:
        con.close()


def _kinds_of(db: Path, tag: str) -> list[tuple[Any, ...]]:
    """The kinds of this test's own failures (instances kinds-<tag>-*), with their counts among them."""
    sql = (
        "SELECT f.kind, k.template, count(*), count(DISTINCT f.instance_id) FROM failures f"
        " JOIN failure_kinds k USING (kind) WHERE f.instance_id LIKE ? GROUP BY ALL"
    )
    con = duckdb.connect(str(db), read_only=True)
    try:
        for stmt in prelude_for(sql):
            con.execute(stmt)
        return sorted(con.execute(sql, [f"kinds-{tag}-%"]).fetchall())
    finally:
        con.close()


def _fail(
    kafka: Any, tmp_path: Path, instance: str, i: int, rnd: random.Random, scripts: dict[str, str] = SCRIPTS
) -> None:
    """One instance's three failed stages, one of each kind, through the real agent and its spool."""
    env = kafka.env(FLIGHTREC_SPOOL=str(tmp_path / f"spool-{instance}"), FLIGHTREC_FACTS="", FLIGHTREC_HEARTBEAT_S="0")
    for stage, script in scripts.items():
        text = script.format(i=i, n=rnd.randint(1, 999), m=rnd.randint(1, 10**6), h=rnd.getrandbits(48))
        r = flightrec(
            "agent", "run", "--instance", instance, "--stage", stage.format(i=i), "--", "sh", "-c", text,
            env=env, check=False,
        )  # fmt: skip
        assert r.returncode != 0, r.stderr
    assert flightrec("agent", "flush", "--timeout", "60", env=env).returncode == 0


def test_thirty_failures_of_three_new_kinds_become_three_kinds_and_a_replay_agrees(kafka, tmp_path, env_for):
    rnd = random.Random(47)
    tag = uuid.uuid4().hex[:6]
    instances = [f"kinds-{tag}-{k}" for k in range(10)]
    for i, instance in enumerate(instances):
        _fail(kafka, tmp_path, instance, i, rnd)
    live = tmp_path / "live.duckdb"
    materialize(kafka, live)
    kinds = _kinds(live)
    assert [(status, failures, n) for _, _, status, failures, n in kinds] == [("new", 10, 10)] * 3, kinds
    assert sorted(t for _, t, *_ in kinds) == [
        "zorblax ledger <hex> turned away after <duration>",
        "zorblax quorum gone: peer <ip> answered <*> frames",
        "zorblax: shard <*> of <path> unreadable at offset <*>",
    ]
    con = duckdb.connect(str(live), read_only=True)
    try:
        classes = con.execute(
            "SELECT DISTINCT failure_class FROM failures WHERE instance_id LIKE ?", [f"kinds-{tag}-%"]
        )
        assert classes.fetchall() == [("unknown",)]
    finally:
        con.close()

    # A replay reads the whole session broker, other tests' failures of the same templates too: compare this
    # test's own failures, kind by kind.
    replayed = tmp_path / "replayed.duckdb"
    flightrec("replay", "--db", str(replayed), env=env_for())
    assert _kinds_of(replayed, tag) == _kinds_of(live, tag) == sorted((k, t, f, n) for k, t, _, f, n in kinds)

    out = flightrec("kinds", "--db", str(live), "--json", env=env_for()).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    mine = [r for r in rows if "zorblax" in r["template"]]
    assert sorted((r["kind"], r["status"], r["failures"], r["instances"]) for r in mine) == [
        (k, s, f, n) for k, _, s, f, n in kinds
    ]
    assert all(len(r["example_failure_ids"]) == 5 for r in mine)
    table = flightrec("kinds", "--db", str(live), env=env_for()).stdout
    assert table.splitlines()[0].split()[:3] == ["KIND", "STATUS", "FAILURES"]
    assert all(k in table for k, *_ in kinds)


def test_a_lake_group_of_two_members_gives_the_kinds_of_one_file(kafka, lake, tmp_path, env_for):
    """The failures split between two members' shards: the failure_kinds view over the lake equals the file's."""
    import subprocess
    import sys

    from lake_helpers import lake_con, seed_lake_at_mark

    db, data_path = lake
    rnd = random.Random(48)
    tag = uuid.uuid4().hex[:6]
    for i in range(10):
        _fail(kafka, tmp_path, f"kinds-{tag}-{i}", i, rnd)
    group = f"kinds-{tag}"
    seed_lake_at_mark(kafka, db, data_path, group)
    exe = Path(sys.executable).with_name("flightrec")
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    members = [
        subprocess.Popen(
            [str(exe), "materialize", "--db", db, "--data-path", data_path, "--group", group, "--until-idle", "6"],
            env={**env_for(), "PYTHONSAFEPATH": "1"},
            stdout=subprocess.DEVNULL,
            stderr=log.open("ab"),
        )
        for log in logs
    ]
    try:
        codes = [m.wait(240) for m in members]
    finally:
        for m in members:
            if m.poll() is None:
                m.kill()
                m.wait(30)
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    con = lake_con(db, data_path)
    try:
        owners = con.execute("SELECT count(DISTINCT owner) FROM claims WHERE owner <> 'seed'").fetchone()[0]
    finally:
        con.close()
    assert owners == 2, "one member read every shard: the failures were not split"
    file = tmp_path / "file.duckdb"
    materialize(kafka, file)
    kinds = _kinds(file)
    assert [(s, f, n) for _, _, s, f, n in kinds] == [("new", 10, 10)] * 3, kinds
    out = flightrec("kinds", "--db", db, "--data-path", data_path, "--json", env=env_for()).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    in_lake = sorted((r["kind"], r["template"], r["status"], r["failures"], r["instances"]) for r in rows)
    assert [r for r in in_lake if "zorblax" in r[1]] == kinds

    # a decision is a manager event in the lake's shared manager_events: every member and reader sees it
    muted = kinds[0][0]
    flightrec("kinds", "mute", muted, env=env_for(FLIGHTREC_SPOOL=str(tmp_path / "manager-spool")))
    again = ["materialize", "--db", db, "--data-path", data_path, "--group", group, "--until-idle", "3"]
    flightrec(*again, env=env_for())
    out = flightrec("kinds", "--db", db, "--data-path", data_path, "--json", env=env_for()).stdout
    mine = {k for k, *_ in kinds}
    status = {r["kind"]: r["status"] for r in map(json.loads, out.splitlines()) if r["kind"] in mine}
    assert status == {k: "muted" if k == muted else "new" for k in mine}


def test_a_database_made_before_kinds_gets_them_at_the_first_open(tmp_path):
    from flightrec.db.filestore import FileStore
    from flightrec.db.fold import RawMessage, fold
    from flightrec.schemas import Lifecycle, encode
    from materializer_helpers import Boot

    b = Boot()
    b.add(Lifecycle, stage="bench-2", state="started")
    lines = ["loading circuit", "Error: witness column 7 has 3 rows, the circuit expects 4"]
    b.exit("bench-2", 1, stderr=lines)
    b.add(Lifecycle, stage="bench-2", state="failed", detail="exit code 1")
    db = tmp_path / "old.duckdb"
    store = FileStore(db, group="t")
    try:
        store.commit(
            fold([RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e)) for n, e in enumerate(b.events)])
        )
    finally:
        store.close()
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE failures DROP COLUMN kind_template")  # as version 7 made it
    con.execute("ALTER TABLE failures DROP COLUMN kind")
    con.execute("DELETE FROM schema_version WHERE version >= 8")
    con.execute("INSERT INTO schema_version (version, what, applied_us, run_id) VALUES (7, 'as before kinds', 0, 't')")
    con.close()
    FileStore(db, group="t").close()
    con = duckdb.connect(str(db), read_only=True)
    try:
        kind, template = con.execute("SELECT kind, kind_template FROM failures").fetchone()
        assert template == "Error: witness column <*> has <*> rows, the circuit expects <*>"
        assert len(kind) == 16
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] >= 8
    finally:
        con.close()


# Three more kinds, in words of their own, for the operator's decisions.
DECIDED = {
    "params": 'echo "vexnor: shard {n} of /data/run-{n}/p.bin unreadable at offset {m}" >&2; exit 3',
    "bench-{i}": 'echo "vexnor quorum gone: peer 10.0.{i}.9:70{i} answered {m} frames" >&2; exit 1',
    "prove": 'echo "vexnor ledger 0x{h:x} turned away after {m}ms" >&2; exit 2',
}


def _listed(db: Path, env: dict[str, str]) -> dict[str, tuple[Any, ...]]:
    """`flightrec kinds --json`'s vexnor kinds, by their template's second word: (kind, status, failures,
    instances, merged_kinds)."""
    out = flightrec("kinds", "--db", str(db), "--json", env=env).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    return {
        r["template"].split()[1]: (r["kind"], r["status"], r["failures"], r["instances"], r["merged_kinds"])
        for r in rows
        if r["template"].startswith("vexnor")
    }


def test_a_mute_and_a_merge_sent_as_manager_events_change_the_kinds_and_a_replay_keeps_them(kafka, tmp_path, env_for):
    rnd = random.Random(147)
    tag = uuid.uuid4().hex[:6]
    for i in range(3):
        _fail(kafka, tmp_path, f"decided-{tag}-{i}", i, rnd, DECIDED)
    live = tmp_path / "live.duckdb"
    materialize(kafka, live)
    before = _listed(live, env_for())
    assert {w: r[1:4] for w, r in before.items()} == {w: ("new", 3, 3) for w in ("shard", "quorum", "ledger")}

    manager = env_for(FLIGHTREC_SPOOL=str(tmp_path / "manager-spool"))
    said = flightrec("kinds", "mute", before["ledger"][0], "--detail", "known, harmless", env=manager).stdout
    assert said.startswith(f"muted {before['ledger'][0]} by manager@") and "delivered" in said
    flightrec("kinds", "merge", before["quorum"][0], before["shard"][0], env=manager)
    materialize(kafka, live)
    after = _listed(live, env_for())
    assert after == {
        "shard": (before["shard"][0], "new", 6, 3, [before["quorum"][0]]),
        "ledger": (before["ledger"][0], "muted", 3, 3, None),
    }
    table = flightrec("kinds", "--db", str(live), env=env_for()).stdout
    assert f"{before['ledger'][0]}  muted" in table and before["quorum"][0] not in table

    replayed = tmp_path / "replayed.duckdb"
    flightrec("replay", "--db", str(replayed), env=env_for())
    assert _listed(replayed, env_for()) == after

    flightrec("kinds", "unmute", before["ledger"][0], env=manager)
    flightrec("kinds", "unmerge", before["quorum"][0], env=manager)
    materialize(kafka, live)
    assert _listed(live, env_for()) == {w: (*r[:4], None) for w, r in before.items()}


def test_kinds_decisions_refuse_what_the_view_could_not_use(tmp_path):
    """A decision that names no kind, merges a kind into itself or splits by an expression RE2 refuses is refused
    before anything is spooled; a split names the kind it makes (db.kinds.split_kind, what the view computes)."""
    from flightrec.db.kinds import split_kind

    spool = tmp_path / "spool"
    env = {"FLIGHTREC_SPOOL": str(spool), "FLIGHTREC_BOOTSTRAP": "127.0.0.1:9", "FLIGHTREC_LOG_LEVEL": "ERROR"}
    k = "0123456789abcdef"
    refused = {
        ("mute", "ABC"): "is not a kind",
        ("merge", k, k.upper()): "is not a kind",
        ("merge", k, k): "into itself",
        ("unmerge", "0x" + k[2:]): "is not a kind",
        ("split", k, "--pattern", "(?=ahead)"): "RE2",
        ("split", k, "--pattern", ""): "1 to",
    }
    for args, says in refused.items():
        r = flightrec("kinds", *args, env=env, check=False)
        assert r.returncode == 1 and says in r.stderr, (args, r.stderr)
    assert not spool.exists()
    pattern = r"device \d+"
    r = flightrec("kinds", "split", k, "--pattern", pattern, "--flush-timeout", "1", env=env)
    assert f"into {split_kind(k, pattern)}" in r.stderr and "spooled, not yet delivered" in r.stderr
    assert (spool / "manager").is_dir()
