"""Real-world failures (tests/corpus/failures.toml): the class and the decisive line each gets, on each part.

The corpus is split once into a `train` part (rules may be written and tuned against it) and a `heldout` part that
no rule is written from; the split is recorded in the file (`[split]`). Each case is a failing stage of one
instance: the lines it quotes, where they appeared (stderr or a followed file), its exit (code or signal), the class a
careful operator gives it (`expected`, or "outside" when no class fits), whether that class follows from its lines at
all (`follows`: the cases whose cause only a later comment reveals are kept apart and not scored), and the line(s)
that say why (`decisive`, 0-based indices into its lines).

The figures (right / wrong / unknown per part; for the cases outside every class: honest `unknown` vs misclassed; the
decisive line shown against the labelled lines, the same text after collapsing whitespace) are printed by
`test_the_figures_on_each_part`, which builds each case's failures row with the materializer's own failure builder
(`build_failure`, from the evidence the agent sends), in `make check`. `test_the_agent_and_the_materializer_agree`
(`make test`) runs every case through the real agent and materializer and checks that they give the same rows. No
rule fires on the healthy lines of the demo fleet and of `flightrec prove bench`.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal as _signal
import socket
import subprocess
import sys
import tomllib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flightrec.db.classify import FailureEvidence, evidence_lines, load_rules, matched_lines
from flightrec.db.failures import build_failure
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.producer.segment import Position
from flightrec.producer.spool import Spool

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "corpus" / "failures.toml"
FLIGHTREC = str(Path(sys.executable).with_name("flightrec"))
RULES = load_rules()
PARTS = ("train", "heldout")
OUTSIDE = "outside"

# The data file's properties once the grown corpus is merged (issue 46).
MIN_CASES, MIN_REPOS, MIN_HELDOUT, MAX_PER_CLASS, MAX_PER_THREAD = 200, 40, 60, 20, 2
# Goals, as the issue states them: on the held-out part at least 90 % right, at most 2 wrong, at most 1 case outside
# every class given a class; the decisive line one of the labelled lines for at least 95 % of all cases. The train
# part, which the rules were written from, is held to at least 95 % right.
TRAIN_RIGHT, HELDOUT_RIGHT, HELDOUT_WRONG, HELDOUT_OUTSIDE_CLASSED, DECISIVE_AGREE = 0.95, 0.90, 2, 1, 0.95
# The held-out figure measured after the rules' last change (right, wrong, outside given a class): a floor, not a goal
HELDOUT_FLOOR = (93, 0, 1)


def corpus() -> dict[str, Any]:
    return tomllib.loads(CORPUS.read_text("utf-8"))


def cases() -> list[dict[str, Any]]:
    return list(corpus()["case"])


def lines_of(case: dict[str, Any]) -> list[str]:
    return str(case["lines"]).lstrip("\n").splitlines()


def collapsed(text: str) -> str:
    return " ".join(text.split())


def repository(source: str) -> str:
    m = re.match(r"https://github\.com/([^/\s]+/[^/\s#?]+)", source)
    return m.group(1).lower() if m else source


def heldout_digest(ids: list[str]) -> str:
    """How `[split]` records the held-out part: the SHA-256 of its case ids, sorted, one per line."""
    return hashlib.sha256("\n".join(sorted(ids)).encode("utf-8")).hexdigest()


# ---- the data file ---------------------------------------------------------------------------------------------------


def test_every_case_is_labelled_and_in_range():
    known = {r.failure_class for r in RULES.rules} - {"unknown"}
    ids = [c["id"] for c in cases()]
    assert len(ids) == len(set(ids)), [i for i, n in Counter(ids).items() if n > 1]
    for c in cases():
        where = c["id"]
        assert where and where == where.strip(), where
        assert c["source"].startswith("https://"), where
        assert c.get("stream", "stderr") in ("stderr", "file"), where
        assert c["expected"] in known | {OUTSIDE}, (where, c["expected"])
        assert c.get("part") in PARTS, (where, "part")
        assert isinstance(c.get("follows"), bool), (where, "follows")
        lines = lines_of(c)
        assert lines and any(line.strip() for line in lines), where
        decisive = c.get("decisive")
        assert isinstance(decisive, list) and decisive, (where, "decisive")
        assert all(isinstance(i, int) and 0 <= i < len(lines) and lines[i].strip() for i in decisive), (where, decisive)
        assert "signal" not in c or c["signal"] in _signal.Signals.__members__, where


def test_no_two_cases_alike_no_class_over_its_share_no_thread_over_two():
    seen: dict[str, str] = {}
    for c in cases():
        text = collapsed("\n".join(lines_of(c)))
        assert text not in seen, (c["id"], "has the same lines as", seen.get(text))
        seen[text] = c["id"]
    per_class = Counter(c["expected"] for c in cases() if c["expected"] != OUTSIDE)
    assert max(per_class.values()) <= MAX_PER_CLASS, per_class.most_common(3)
    per_thread = Counter(c["source"] for c in cases())
    assert max(per_thread.values()) <= MAX_PER_THREAD, per_thread.most_common(3)


def test_a_recorded_split_matches_the_parts():
    """`[split]` holds how many cases are held out and the digest of their ids: moving a case between the parts
    changes the file's record too, in the same commit."""
    heldout = [c["id"] for c in cases() if c.get("part") == "heldout"]
    split = corpus().get("split")
    if split is None:
        assert not heldout, "held-out cases without a [split] record"
        return
    assert split.get("method") and split.get("made"), split
    assert split.get("heldout") == len(heldout), (split.get("heldout"), len(heldout))
    assert split.get("heldout_ids_sha256") == heldout_digest(heldout)


def test_the_corpus_is_big_varied_and_split():
    all_cases = cases()
    assert len(all_cases) >= MIN_CASES, len(all_cases)
    assert len({repository(c["source"]) for c in all_cases}) >= MIN_REPOS
    assert sum(c.get("part") == "heldout" for c in all_cases) >= MIN_HELDOUT
    assert corpus().get("split"), "the split is recorded"


# ---- the figures -----------------------------------------------------------------------------------------------------


def _evidence_rows(case: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The lifecycle and exit rows the agent sends for a case's stage (as `flightrec agent run` makes them)."""
    lines = lines_of(case)
    sig = case.get("signal")
    number = int(_signal.Signals[sig]) if sig else None
    code = None if sig else int(case.get("exit_code", 1))
    in_file = case.get("stream") == "file"
    stderr = [] if in_file else lines
    last = next((line for line in reversed(stderr) if line.strip()), "")
    how = f"killed by signal {number} ({sig})" if sig else f"exit code {code}"
    detail = how + (f"; last stderr line: {last[:500]}" if last else "")
    exit_row = {
        "event_id": "exit",
        "seq": 2,
        "ts_us": 2,
        "exit_code": code,
        "signal": number,
        "signal_name": sig,
        "stderr_tail": stderr,
        "stdout_tail": [],
        "file_tails": [{"path": f"/var/log/{case['id']}.log", "lines": lines, "exists": True}] if in_file else [],
        "start_error": None,
        "timed_out": False,
    }
    life = [
        {"event_id": "a", "seq": 1, "ts_us": 1, "kind": "lifecycle", "stage": "b", "state": "started"},
        {"event_id": "z", "seq": 3, "ts_us": 3, "kind": "lifecycle", "stage": "b", "state": "failed", "detail": detail},
    ]
    return life, [exit_row]


def classify_case(case: dict[str, Any]) -> dict[str, Any]:
    """The failures row the materializer's failure builder makes of a case's stage: class and decisive line."""
    life, exits = _evidence_rows(case)
    row = build_failure(
        "corpus", "boot", "b", lifecycle=life, exits=exits, results=[], facts=None, log_tails={}, rules=RULES
    )
    assert row is not None, case["id"]
    return {"class": row["failure_class"], "decisive": row["decisive_line"]}


@dataclass
class Figures:
    """One part's figures."""

    right: list[str]
    wrong: list[tuple[str, str, str]]  # (id, expected, got)
    unknown: list[tuple[str, str]]  # (id, expected)
    outside_unknown: list[str]
    outside_classed: list[tuple[str, str]]  # (id, got)
    apart: list[str]  # follows = false: not scored
    agree: list[str]
    disagree: list[tuple[str, str]]  # (id, the line shown)

    @property
    def scored(self) -> int:
        return len(self.right) + len(self.wrong) + len(self.unknown)

    @property
    def cases(self) -> int:
        return len(self.agree) + len(self.disagree)


def figures(part: list[dict[str, Any]], rows: dict[str, dict[str, Any]]) -> Figures:
    f = Figures([], [], [], [], [], [], [], [])
    for c in part:
        got = rows[c["id"]]
        shown, labelled = collapsed(got["decisive"] or ""), {collapsed(lines_of(c)[i]) for i in c["decisive"]}
        (f.agree.append(c["id"]) if shown in labelled else f.disagree.append((c["id"], got["decisive"] or "")))
        if not c["follows"]:
            f.apart.append(c["id"])
        elif c["expected"] == OUTSIDE:
            (
                f.outside_unknown.append(c["id"])
                if got["class"] == "unknown"
                else f.outside_classed.append((c["id"], got["class"]))
            )
        elif got["class"] == c["expected"]:
            f.right.append(c["id"])
        elif got["class"] == "unknown":
            f.unknown.append((c["id"], c["expected"]))
        else:
            f.wrong.append((c["id"], c["expected"], got["class"]))
    return f


def _pct(n: int, of: int) -> str:
    return f"{n / of:.0%}" if of else "-"


# The held-out part's cases are named only on request: whoever tunes rules reads its figures, never its cases.
SHOW_HELDOUT = os.environ.get("FLIGHTREC_CORPUS_SHOW_HELDOUT") == "1"


def report(name: str, f: Figures) -> str:
    """One part's figures as the test prints them (the held-out cases named only on request)."""
    out = [
        f"{name}: {f.cases} cases; classed {len(f.right)} right of {f.scored} ({_pct(len(f.right), f.scored)}), "
        f"{len(f.wrong)} wrong, {len(f.unknown)} unknown; outside every class: {len(f.outside_unknown)} honest "
        f"unknown, {len(f.outside_classed)} given a class; {len(f.apart)} apart (class not in their lines); "
        f"decisive line shown is a labelled one for {len(f.agree)} of {f.cases} ({_pct(len(f.agree), f.cases)})"
    ]
    if name.startswith("heldout") and not SHOW_HELDOUT:
        return out[0] + " (its cases named with FLIGHTREC_CORPUS_SHOW_HELDOUT=1: not for whoever writes rules)"
    out += [f"    wrong: {i}: expected {e}, got {g}" for i, e, g in f.wrong]
    out += [f"    unknown: {i}: expected {e}" for i, e in f.unknown]
    out += [f"    outside, classed: {i}: got {g}" for i, g in f.outside_classed]
    out += [f"    decisive not labelled: {i}: {line[:140]!r}" for i, line in f.disagree]
    return "\n".join(out)


@pytest.fixture(scope="module")
def by_builder() -> dict[str, dict[str, Any]]:
    return {c["id"]: classify_case(c) for c in cases()}


def _parts() -> dict[str, list[dict[str, Any]]]:
    return {p: [c for c in cases() if c.get("part") == p] for p in PARTS}


def test_the_figures_on_each_part(by_builder, capsys):
    parts = _parts()
    with capsys.disabled():
        print()
        for name, part in parts.items():
            print(report(name, figures(part, by_builder)))
    train = figures(parts["train"], by_builder)
    right, scored = len(train.right), train.scored
    assert right >= TRAIN_RIGHT * scored, report("train", train)
    everything = figures(cases(), by_builder)
    agree, all_cases = len(everything.agree), everything.cases
    assert agree >= DECISIVE_AGREE * all_cases, f"decisive line a labelled one for {agree} of {all_cases} cases"


def test_the_heldout_part_keeps_its_floor(by_builder, capsys):
    """The held-out part's figure may not fall below what was measured when the rules were last changed
    (``HELDOUT_FLOOR``); the issue's goals (``HELDOUT_RIGHT``, ``HELDOUT_WRONG``, ``HELDOUT_OUTSIDE_CLASSED``) are
    printed beside it, met or not (today they are met), and a rule written to meet them must come from the train part.
    The assertions compare plain counts: pytest's rewriting of `len(held.right)` would print the held-out cases'
    ids and lines, which whoever writes rules must not read."""
    held = figures(_parts()["heldout"], by_builder)
    said = report("heldout", held)
    cases_, right, scored = held.cases, len(held.right), held.scored
    wrong, outside_classed = len(held.wrong), len(held.outside_classed)
    met = right >= HELDOUT_RIGHT * scored and wrong <= HELDOUT_WRONG and outside_classed <= HELDOUT_OUTSIDE_CLASSED
    with capsys.disabled():
        print(
            f"\nthe issue's goals on heldout (>= {HELDOUT_RIGHT:.0%} right, <= {HELDOUT_WRONG} wrong, "
            f"<= {HELDOUT_OUTSIDE_CLASSED} outside classed): {'met' if met else 'NOT met'}"
        )
    floor_right, floor_wrong, floor_outside = HELDOUT_FLOOR
    assert cases_ >= MIN_HELDOUT, said
    assert right >= floor_right, said
    assert wrong <= floor_wrong, said
    assert outside_classed <= floor_outside, said


# ---- the real agent and materializer ---------------------------------------------------------------------------------

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


AGENTS = 4  # agents run at once (each in its own spool): most of an agent's time is its start and its exit's waits


def _stage_of(case: dict[str, Any]) -> str:
    """A case's stage name for the agent: unique, and with no word of the case's id (an id such as
    `...-download-checksums` would hand the rules narrowed by stage name a word the builder's stage `b` lacks)."""
    return f"b-{hashlib.sha256(case['id'].encode()).hexdigest()[:12]}"


def _run_case(case: dict[str, Any], tmp: Path, env: dict[str, str], spool: Path) -> None:
    """One case as a stage of the real agent: the command writes the quoted lines and ends as the source shows."""
    log = tmp / f"{case['id']}.log"
    argv = [FLIGHTREC, "agent", "run", "--stage", _stage_of(case)]
    if case.get("stream") == "file":
        argv += ["--tail", str(log)]
    text = str(case["lines"]).lstrip("\n")
    argv += ["--", sys.executable, "-c", CASE_CMD, text, case.get("stream", "stderr"), str(log)]
    argv += [str(case.get("exit_code", 1)), case.get("signal", "")]
    subprocess.run(argv, env={**env, "FLIGHTREC_SPOOL": str(spool)}, capture_output=True, timeout=120, check=False)


def _spooled(spool: Path, instance: str) -> list[Any]:
    s = Spool(spool, instance)
    try:
        records, _ = s.read(Position(0, 0), s.committed_end(), max_bytes=1 << 40)
    finally:
        s.close()
    return list(records)


@pytest.fixture(scope="module")
def by_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """Each case's failures row (class, decisive line) through the real agent, its spool and the materializer."""
    from concurrent.futures import ThreadPoolExecutor

    tmp = tmp_path_factory.mktemp("corpus")
    instance = "corpus-01"
    spools = [tmp / f"spool-{n}" for n in range(AGENTS)]
    with socket.socket() as held:  # a port bound and never listened on: the agent delivers nothing
        held.bind(("127.0.0.1", 0))
        env = dict(
            os.environ,
            FLIGHTREC_BOOTSTRAP=f"127.0.0.1:{held.getsockname()[1]}",
            FLIGHTREC_INSTANCE=instance,
            FLIGHTREC_FLUSH_TIMEOUT="0",
            FLIGHTREC_FACTS="",
            FLIGHTREC_HEARTBEAT_S="0",
            FLIGHTREC_SECRET_SHAPES="",  # the quoted lines as they are (the redactor has its own tests)
        )
        all_cases = cases()
        with ThreadPoolExecutor(AGENTS) as pool:
            for n in range(AGENTS):  # each worker its own spool, its cases one after another
                pool.submit(lambda n=n: [_run_case(c, tmp, env, spools[n]) for c in all_cases[n::AGENTS]])
    records = [r for spool in spools for r in _spooled(spool, instance)]
    delta = fold([RawMessage(r.topic, 0, n, r.key, r.value) for n, r in enumerate(records)])
    store = FileStore(tmp / "corpus.duckdb", group="corpus")
    try:
        store.commit(delta)
        rows = store.con.execute("SELECT stage, failure_class, decisive_line FROM failures").fetchall()
    finally:
        store.close()
    stages = {_stage_of(c): c["id"] for c in all_cases}
    yield {stages[stage]: {"class": c, "decisive": d} for stage, c, d in rows if stage in stages}


@pytest.mark.slow
def test_the_agent_and_the_materializer_agree(by_agent, by_builder, capsys):
    """Every case through the real agent (its spool) and the materializer's fold and store: the same class and
    decisive line as the figures' (the path from a command's output to a failures row adds nothing)."""
    with capsys.disabled():
        print()
        for name, part in _parts().items():
            print(report(f"{name} (agent and materializer)", figures(part, by_agent)))
    differ = {i: (by_agent.get(i), by_builder[i]) for i in by_builder if by_agent.get(i) != by_builder[i]}
    held = {c["id"] for c in _parts()["heldout"]}
    named = {i: rows for i, rows in differ.items() if SHOW_HELDOUT or i not in held}  # held-out cases: counted only
    assert not differ, (f"{len(differ)} cases differ ({len(differ) - len(named)} held out)", named)


# ---- healthy lines ---------------------------------------------------------------------------------------------------


def _prove_bench_lines(backend: str) -> list[str]:
    """What a passing `flightrec prove bench` prints (its log and verdict) and the details of the events it sends."""
    import json

    bench = subprocess.run(
        [FLIGHTREC, "prove", "bench", "--backend", backend, "--k", "8", "--warmup", "1", "--proofs", "2"]
        + ["--min-rate", "1", "--instance", "healthy-01", "--print"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = bench.stderr.splitlines()
    for line in bench.stdout.splitlines():  # the events it would send, as JSON: their details and phases
        try:
            event = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        if isinstance(event, dict) and event.get("state") in (None, "failed"):  # what a failure's evidence holds
            out += [str(v) for k, v in event.items() if k in ("detail", "phase", "verdict", "backend") and v]
    return out


def _healthy_lines(tmp: Path) -> list[str]:
    """What the demo fleet's healthy stages print and its daemon logs, run for real, and a passing benchmark's."""
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
    return [line for line in out if line.strip()]


def _fired(lines: list[str]) -> list[tuple[str, str]]:
    """The (rule, line) pairs where a rule would take a healthy line as evidence (the classifier's own reading: a
    line's first SCAN_CHARS characters, lines logged at INFO or DEBUG left out), and the lines classed at all."""
    ev = FailureEvidence(stage="benchmark", stderr_tail=lines)
    loud = evidence_lines(ev)
    fired = [(r.rule_id, at.text) for r in RULES.rules if r.lines for at in matched_lines(r, loud)]
    return fired + [(c, line) for line in lines if (c := _class_of(line)) != "unknown"]


def _class_of(line: str) -> str:
    return RULES.classify(FailureEvidence(stage="benchmark", stderr_tail=[line])).failure_class


@pytest.mark.slow
def test_no_rule_fires_on_the_demo_fleets_healthy_lines(tmp_path):
    healthy = _healthy_lines(tmp_path)
    assert len(healthy) >= 10, healthy
    assert _fired(healthy) == []


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", "auto"])  # auto: where CUDA cannot serve, it says why at INFO level
def test_no_rule_fires_on_what_a_passing_prove_bench_prints(backend):
    healthy = [line for line in _prove_bench_lines(backend) if line.strip()]
    assert len(healthy) >= 3, healthy
    assert _fired(healthy) == []
