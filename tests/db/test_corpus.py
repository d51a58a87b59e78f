"""Real-world failures (tests/corpus/failures.toml) through the real agent and materializer: the class each gets.

Every case is a failing stage of one instance: a command that writes the quoted lines to stderr (or to a log file
the stage follows) and exits as the source shows (an exit code, or a signal it sends itself). The agent spools the
stage's events with no broker; the materializer's own fold and FileStore commit them; the class is read from the
failures table. The figure (right / wrong / unknown) is printed; the goal is >= 95 % right and no case `unknown`
whose class exists. The healthy lines of the demo fleet match no rule's lines.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flightrec.db.classify import load_rules
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.producer.segment import Position
from flightrec.producer.spool import Spool

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus" / "failures.toml"
FLIGHTREC = str(Path(sys.executable).with_name("flightrec"))
GOAL = 0.95

# What a case's command does: write the quoted lines where the source saw them, then end as the source shows.
CASE_CMD = r"""
import os, signal, sys
lines, stream, path, code, sig = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
if stream == "file":
    with open(path, "a") as f:
        f.write(lines)
else:
    sys.stderr.write(lines)
    sys.stderr.flush()
if sig:
    if sig not in ("SIGKILL", "SIGSTOP"):  # those two cannot be caught, so their disposition is the default
        signal.signal(getattr(signal, sig), signal.SIG_DFL)
    os.kill(os.getpid(), getattr(signal, sig))
sys.exit(code)
"""


def cases() -> list[dict[str, Any]]:
    return list(tomllib.loads(CORPUS.read_text("utf-8"))["case"])


@pytest.fixture(scope="module")
def classified(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Each case's failures row (class, matched line), by case id."""
    tmp = tmp_path_factory.mktemp("corpus")
    spool, instance = tmp / "spool", "corpus-01"
    with socket.socket() as held:  # a port bound and never listened on: the agent delivers nothing
        held.bind(("127.0.0.1", 0))
        env = dict(
            os.environ,
            FLIGHTREC_BOOTSTRAP=f"127.0.0.1:{held.getsockname()[1]}",
            FLIGHTREC_SPOOL=str(spool),
            FLIGHTREC_INSTANCE=instance,
            FLIGHTREC_FLUSH_TIMEOUT="0",
            FLIGHTREC_FACTS="",
            FLIGHTREC_HEARTBEAT_S="0",
        )
        stages = {}
        for case in cases():
            stage = f"benchmark-{case['id']}"
            stages[stage] = case["id"]
            log = tmp / f"{case['id']}.log"
            argv = [FLIGHTREC, "agent", "run", "--stage", stage]
            if case.get("stream") == "file":
                argv += ["--tail", str(log)]
            lines = case["lines"].lstrip("\n")
            argv += [
                "--",
                sys.executable,
                "-c",
                CASE_CMD,
                lines,
                case.get("stream", "stderr"),
                str(log),
                str(case.get("exit_code", 1)),
                case.get("signal", ""),
            ]
            subprocess.run(argv, env=env, capture_output=True, timeout=120, check=False)
    s = Spool(spool, instance)
    try:
        records, _ = s.read(Position(0, 0), s.committed_end(), max_bytes=1 << 40)
    finally:
        s.close()
    delta = fold([RawMessage(r.topic, 0, n, r.key, r.value) for n, r in enumerate(records)])
    store = FileStore(tmp / "corpus.duckdb", group="corpus")
    try:
        store.commit(delta)
        rows = store.con.execute("SELECT stage, failure_class, matched_line FROM failures").fetchall()
    finally:
        store.close()
    yield {stages[stage]: {"class": cls, "matched": matched} for stage, cls, matched in rows if stage in stages}


def test_the_corpus_is_real_and_varied():
    all_cases = cases()
    assert len(all_cases) >= 60
    assert len({c["id"] for c in all_cases}) == len(all_cases)
    for c in all_cases:
        assert c["source"].startswith("https://"), c["id"]
        assert c["lines"].strip() and c.get("stream", "stderr") in ("stderr", "file"), c["id"]
    per_class: dict[str, int] = {}
    for c in all_cases:
        per_class[c["expected"]] = per_class.get(c["expected"], 0) + 1
    assert max(per_class.values()) <= len(all_cases) / 10, per_class  # no class more than a tenth


@pytest.mark.slow
def test_the_classifier_explains_the_real_failures(classified, capsys):
    all_cases = cases()
    known = {r.failure_class for r in load_rules().rules}
    right, wrong, unknown = [], [], []
    for c in all_cases:
        got = classified.get(c["id"], {}).get("class")
        (right if got == c["expected"] else unknown if got in (None, "unknown") else wrong).append((c, got))
    with capsys.disabled():
        print(
            f"\ncorpus: {len(right)} of {len(all_cases)} classed right ({len(right) / len(all_cases):.0%}), "
            f"{len(wrong)} wrong, {len(unknown)} unknown"
        )
        for c, got in wrong + unknown:
            print(f"  {c['id']}: expected {c['expected']}, got {got}")
    assert not [c["id"] for c, _ in unknown if c["expected"] in known], "a case whose class exists is unknown"
    assert len(right) >= GOAL * len(all_cases)


@pytest.mark.slow
def test_the_matched_line_is_the_decisive_one(classified):
    """The line that decided a case's class is one of its quoted lines (not the agent's own words)."""
    for c in cases():
        row = classified.get(c["id"])
        if row and row["class"] == c["expected"] and row["matched"] and not row["matched"].startswith("signal "):
            quoted = [line.strip() for line in c["lines"].splitlines()]
            assert row["matched"].strip() in quoted, (c["id"], row["matched"])


def _healthy_lines(tmp: Path) -> list[str]:
    """What the demo fleet's healthy stages print and its daemon logs, run for real (and a real benchmark's)."""
    fleet = [sys.executable, "-m", "flightrec.demo.fleet"]
    out: list[str] = []
    for stage in (["register"], ["params"], ["supervisor", "--seconds", "1"]):
        r = subprocess.run(fleet + stage, capture_output=True, text=True, timeout=60, check=True)
        out += (r.stdout + r.stderr).replace("\r", "\n").splitlines()
    log = tmp / "daemon.log"
    daemon = subprocess.Popen(fleet + ["daemon", "--log", str(log)])
    try:
        subprocess.run([sys.executable, "-c", "import time; time.sleep(1.5)"], check=True)
    finally:
        daemon.kill()
        daemon.wait()
    out += log.read_text().splitlines()
    bench = subprocess.run(
        [
            FLIGHTREC,
            "prove",
            "bench",
            "--backend",
            "cpu",
            "--k",
            "8",
            "--warmup",
            "1",
            "--proofs",
            "2",
            "--min-rate",
            "1",
            "--instance",
            "healthy-01",
            "--print",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out += bench.stderr.splitlines()  # its log and verdict (stdout holds the events it would send, as JSON)
    return [line for line in out if line.strip()]


@pytest.mark.slow
def test_no_rule_fires_on_the_demo_fleets_healthy_lines(tmp_path):
    healthy = _healthy_lines(tmp_path)
    assert len(healthy) >= 10, healthy
    fired = [
        (rule.failure_class, line)
        for rule in load_rules().rules
        for line in healthy
        if any(p.search(line) for p in rule.lines)
    ]
    assert fired == []
