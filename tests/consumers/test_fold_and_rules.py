"""Pure parts of the materializer: the fold, the failure builder, the rule table, seq gaps, time parsing."""

from __future__ import annotations

import pytest
from flightrec.consumers.materializer import event_filter, parse_time
from flightrec.db.classify import FailureEvidence, load_rules, parse_rules
from flightrec.db.derive import incomplete_reason, missing_ranges
from flightrec.db.failures import build_failure
from flightrec.db.fold import RawMessage, fold
from flightrec.schemas import Lifecycle, encode
from hypothesis import given, settings
from hypothesis import strategies as st
from materializer_helpers import Boot, motivating_boot

from flightrec.errors import ConfigError

RULES = load_rules()


def _msgs(events):
    return [RawMessage(e.topic, 0, i, e.instance_id.encode(), encode(e)) for i, e in enumerate(events)]


def test_fold_lays_lines_out_as_arrow_columns_and_drops_repeats_in_a_batch():
    b = motivating_boot()
    msgs = _msgs(b.events)
    d = fold(msgs + msgs[:3])
    assert d.duplicates == 3 and d.messages == len(msgs) + 3
    assert d.events.num_rows == len(b.events)
    assert d.logs.num_rows == 3 + 2 + 4 + 1  # one line per ok stage, stdout, daemon log, stderr
    assert d.logs.column("source").to_pylist().count("/var/log/prover-daemon.log") == 4
    assert d.offsets == {
        (t, 0): max(i for i, m in enumerate(msgs) if m.topic == t) + 1 for t in {m.topic for m in msgs}
    }
    assert d.exits.num_rows == 4 and d.facts.num_rows == 1 and d.throughput.num_rows == 2
    assert d.dead.num_rows == 0


def test_fold_offsets_are_the_next_offset_per_partition():
    b = Boot()
    b.facts()
    b.lines("s", "stdout", ["a"])
    msgs = [
        RawMessage(b.events[0].topic, 3, 41, None, encode(b.events[0])),
        RawMessage(b.events[1].topic, 1, 7, None, encode(b.events[1])),
        RawMessage(b.events[1].topic, 1, 8, None, b"bad"),
    ]
    d = fold(msgs)
    assert d.offsets == {("flightrec.lifecycle", 3): 42, ("flightrec.logs", 1): 9}
    assert d.dead.to_pylist()[0]["offset"] == 8


def test_filter_keeps_one_instance_since_a_time():
    a, b = Boot(), Boot()
    a.facts()
    a.lines("s", "stdout", ["x"])
    b.facts()
    keep = event_filter(a.instance, a.events[1].ts_us)
    d = fold(_msgs(a.events + b.events), keep=keep)
    assert d.events.column("event_id").to_pylist() == [a.events[1].event_id]
    assert d.skipped == 2
    assert event_filter(None, None) is None


@given(st.lists(st.integers(0, 40), unique=True), st.one_of(st.none(), st.integers(0, 45)))
@settings(max_examples=200, deadline=None)
def test_missing_ranges_are_exactly_the_absent_seqs(present, sealed):
    seqs = sorted(present)
    upto = None if sealed is None else sealed - 1
    gaps = missing_ranges(seqs, upto)
    missing = {s for a, z in gaps for s in range(a, z + 1)}
    top = upto if upto is not None else (max(seqs) if seqs else -1)
    assert missing == {s for s in range(0, top + 1) if s not in present}


def test_incomplete_reason_text():
    assert incomplete_reason(None, []) == "not sealed"
    assert incomplete_reason(10, [(2, 3), (5, 5)]) == "missing seq 2..3, 5"
    assert incomplete_reason(None, [(0, 0)]) == "not sealed; missing seq 0"
    assert "and 2 more ranges" in incomplete_reason(100, [(i * 3, i * 3) for i in range(7)])


@pytest.mark.parametrize(
    "line, cls",
    [
        ("CUDA error: no kernel image is available for execution on the device", "gpu_arch_unsupported"),
        ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda_out_of_memory"),
        ("CUDA driver version is insufficient for CUDA runtime version", "driver_mismatch"),
        ("cuInit failed: CUDA_ERROR_NO_DEVICE", "cuda_init_failed"),
        ("Out of memory: Killed process 4242 (prover)", "oom_killed"),
        ("error: protocol version mismatch: manager speaks v3, worker v2", "protocol_mismatch"),
        ("something nobody has seen before", "unknown"),
    ],
)
def test_rules_classify_lines(line, cls):
    ev = FailureEvidence(stage="benchmark", exit_code=1, file_tails=[("/var/log/d.log", ["ok", line])])
    got = RULES.classify(ev)
    assert got.failure_class == cls
    if cls != "unknown":
        assert got.rule_line == line and got.hint and got.rule_id and got.rules_version == RULES.version


def test_rules_classify_exits_and_results():
    c = RULES.classify
    assert c(FailureEvidence(stage="supervisor", signal=9)).failure_class == "oom_killed"
    assert c(FailureEvidence(stage="supervisor", signal=11)).failure_class == "daemon_crashed"
    assert c(FailureEvidence(stage="supervisor", signal=15, timed_out=True)).failure_class == "timeout"
    assert c(FailureEvidence(stage="params", exit_code=22)).failure_class == "params_download_failed"
    assert (
        c(
            FailureEvidence(
                stage="benchmark", exit_code=1, verdict="fail", proofs_per_hour=3.0, stderr_tail=["CUDA out of memory"]
            )
        ).failure_class
        == "below_min_rate"
    )
    # Zero proofs is not "slow": it falls through to what the lines say.
    assert (
        c(
            FailureEvidence(
                stage="benchmark", exit_code=1, verdict="fail", proofs_per_hour=0.0, stderr_tail=["CUDA out of memory"]
            )
        ).failure_class
        == "cuda_out_of_memory"
    )
    assert (
        c(FailureEvidence(stage="x", start_error="No such file or directory: 'prove'")).failure_class
        == "process_start_failed"
    )


def test_adding_a_rule_needs_no_code_change(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text(
        '[[rule]]\nclass = "license_expired"\nhint = "Renew the license."\nlines = ["license has expired"]\n'
        + (load_rules.__globals__["resources"].files("flightrec.db") / "rules.toml").read_text()
    )
    rules = load_rules(path)
    ev = FailureEvidence(stage="supervisor", exit_code=1, stderr_tail=["prover: license has expired"])
    assert rules.classify(ev).failure_class == "license_expired"
    assert RULES.classify(ev).failure_class != "license_expired"


@pytest.mark.parametrize(
    "text, why",
    [
        ("[[rule]]\nhint = 'x'\n", "needs a class"),
        ("[[rule]]\nclass = 'a'\nhint = 'x'\nlines = ['(']\n", "bad regular expression"),
        ("[[rule]]\nclass = 'a'\nhint = 'x'\ncolour = 'red'\n", "unknown keys"),
        ("not toml = = =", "not valid TOML"),
        ("", "no [[rule]]"),
    ],
)
def test_bad_rule_tables_are_refused_with_the_reason(text, why):
    with pytest.raises(ConfigError, match=why.replace("[", r"\[")):
        parse_rules(text)


def test_failure_builder_is_order_independent_and_none_without_failure():
    b = motivating_boot()
    recs = [e.to_record() for e in b.events]
    for r in recs:
        if "file_tails" in r:
            r["file_tails"] = [dict(t) for t in r["file_tails"]]
    life = [{**r, "kind": "lifecycle"} for r, e in zip(recs, b.events, strict=True) if e.name.endswith("Lifecycle")]
    exits = [
        r for r, e in zip(recs, b.events, strict=True) if e.name.endswith("ProcessExit") and r["stage"] == "benchmark"
    ]
    results = [r for r, e in zip(recs, b.events, strict=True) if e.name.endswith("BenchmarkResult")]
    kw = dict(exits=exits, results=results, facts=recs[0], log_tails={}, rules=RULES)
    one = build_failure(b.instance, b.boot, "benchmark", lifecycle=life, **kw)
    two = build_failure(
        b.instance, b.boot, "benchmark", lifecycle=list(reversed(life)), **{**kw, "exits": list(reversed(exits))}
    )
    assert one == two and one["failure_class"] == "gpu_arch_unsupported"
    assert (
        build_failure(
            b.instance, b.boot, "tunnel", lifecycle=life, exits=[], results=[], facts=None, log_tails={}, rules=RULES
        )
        is None
    )


def test_a_failed_event_that_reports_another_stages_failure_is_no_failure_of_its_own():
    b = Boot()
    stopped = b.add(
        Lifecycle,
        stage="entrypoint",
        state="failed",
        detail="stage benchmark failed",
        attributes={"failed_stage": "benchmark"},
    ).to_record()
    plain = b.add(Lifecycle, stage="entrypoint", state="failed", detail="exited outside any stage").to_record()
    kw = dict(exits=[], results=[], facts=None, log_tails={}, rules=RULES)
    assert build_failure(b.instance, b.boot, "entrypoint", lifecycle=[{**stopped, "kind": "lifecycle"}], **kw) is None
    row = build_failure(b.instance, b.boot, "entrypoint", lifecycle=[{**plain, "kind": "lifecycle"}], **kw)
    assert row is not None and row["detail"] == "exited outside any stage"


def test_parse_time():
    assert parse_time("2025-01-31T12:00:00Z") == 1738324800 * 1_000_000
    assert parse_time("1738324800") == 1738324800 * 1_000_000
    assert parse_time("2h", now=10_000.0) == (10_000 - 7200) * 1_000_000
    with pytest.raises(ConfigError):
        parse_time("yesterday-ish")


def test_killed_by_reads_the_stage_a_shell_code_or_a_wrapper_report():
    from flightrec.db.classify import killed_by

    assert killed_by(9, "SIGKILL", None, []) == ("SIGKILL", "the stage's command was killed by it")
    assert killed_by(11, None, None, [])[0] == "SIGSEGV"  # the name from the number
    assert killed_by(None, None, 139, [])[0] == "SIGSEGV"  # a shell's 128 + 11
    name, where = killed_by(None, None, 1, ["prover daemon (pid 7) was killed by signal SIGSEGV (core dumped)"])
    assert name == "SIGSEGV" and "pid 7" in where
    assert killed_by(None, None, 1, ["Segmentation fault (core dumped)"])[0] == "SIGSEGV"
    assert killed_by(None, None, 1, ["exit status 1", "SIGNALS are fine"]) == (None, None)
    assert killed_by(None, None, 1, ["sending SIGTERM to the workers", "exit status 1"]) == (None, None)
    assert killed_by(None, None, 1, ["received SIGTERM, shutting down"])[0] == "SIGTERM"
    for calm in (
        "ignoring SIGPIPE signal",
        "received SIGHUP, reloading configuration",
        "SIGCHLD received from child 7 (exit 0)",
        "Sending signal SIGTERM to pid 42",
        "transaction aborted",
        "connection aborted by peer",
        "installed a handler for SIGSEGV",
    ):
        assert killed_by(None, None, 1, [calm]) == (None, None), calm
    for line, sig in (
        ("the prover was killed by signal 11", "SIGSEGV"),
        ("Killed", "SIGKILL"),
        ("run.sh: line 3:  4242 Killed                  prover --daemon", "SIGKILL"),
        ("Terminated", "SIGTERM"),
        ("Aborted (core dumped)", "SIGABRT"),
        ("worker died of SIGUSR1", "SIGUSR1"),
        ("Bus error (core dumped)", "SIGBUS"),
    ):
        assert killed_by(None, None, 1, [line])[0] == sig, line
    assert killed_by(None, None, 1, ["child died of SIGTERM", "prover killed by signal SIGSEGV"])[0] == "SIGTERM"
    assert (
        killed_by(None, None, 1, ["fatal error: unexpected signal [signal SIGSEGV: segmentation violation]"])[0]
        == "SIGSEGV"
    )
    assert killed_by(None, None, 0, []) == (None, None)


def _segv_wrapper_boot() -> Boot:
    b = Boot()
    b.add(Lifecycle, stage="benchmark", state="started")
    b.lines("benchmark", "stderr", ["prover daemon (pid 7) was killed by signal SIGSEGV (core dumped)"])
    b.exit("benchmark", 1, stderr=["prover daemon (pid 7) was killed by signal SIGSEGV (core dumped)"])
    b.add(Lifecycle, stage="benchmark", state="failed", detail="benchmark exited 1")
    return b


def _store(path, boots) -> None:
    from flightrec.db.filestore import FileStore

    events = [e for b in boots for e in b.events]
    store = FileStore(path, group="t")
    try:
        store.commit(fold([RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e)) for n, e in enumerate(events)]))
    finally:
        store.close()


def test_a_daemon_s_signal_is_stored_with_its_failure(tmp_path):
    """The signal a wrapper reports for a process it started is in the failures row, for SQL and every page."""
    import duckdb

    db = tmp_path / "f.duckdb"
    b = _segv_wrapper_boot()
    _store(db, [b])
    con = duckdb.connect(str(db), read_only=True)
    row = con.execute("SELECT exit_code, signal, killed_by, killed_by_evidence FROM failures").fetchone()
    con.close()
    assert row[:3] == (1, None, "SIGSEGV") and "pid 7" in row[3]
    from flightrec.consumers.timeline import from_db, render

    text = render(from_db(db, b.instance)[0])
    assert "killed by SIGSEGV" in next(line for line in text.splitlines() if "FAILURE" in line)


def test_a_database_made_before_killed_by_gets_it_filled_at_the_first_open(tmp_path):
    import duckdb
    from flightrec.db.filestore import FileStore

    db = tmp_path / "old.duckdb"
    _store(db, [_segv_wrapper_boot()])
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE failures DROP COLUMN killed_by_evidence")
    con.execute("ALTER TABLE failures DROP COLUMN killed_by")  # as the release before it made them
    con.execute("DROP TABLE schema_version")  # (which recorded no versions)
    before = con.execute("SELECT * FROM failures").fetchall()
    con.close()
    from flightrec.db.query import run_query
    from flightrec.db.views import VIEWS

    from flightrec.errors import MaterializeError, QueryError

    with pytest.raises(QueryError, match="older flightrec.*flightrec materialize"):  # a reader before any writer
        run_query(db, "SELECT killed_by FROM failure_context", prelude=VIEWS)
    import flightrec.db.filestore as store_mod

    def broken(*args, **kwargs):
        raise RuntimeError("killed mid-way")

    real, store_mod.recompute_failures = store_mod.recompute_failures, broken
    try:  # an error (or a crash) while the rows are built again leaves the file as it was: the next open does it all
        with pytest.raises(MaterializeError, match="as it was"):
            FileStore(db, group="t")
    finally:
        store_mod.recompute_failures = real
    FileStore(db, group="t").close()
    assert run_query(db, "SELECT killed_by FROM failure_context", prelude=VIEWS).to_pylist() == [
        {"killed_by": "SIGSEGV"}
    ]
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT killed_by FROM failures").fetchall() == [("SIGSEGV",)]
    assert con.execute("SELECT * EXCLUDE (killed_by, killed_by_evidence) FROM failures").fetchall() == before
    con.close()
