"""CLI manners: help on every option, no traceback into a closed pipe, short source names in `timeline`."""

from __future__ import annotations

import argparse
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from flightrec.db.filestore import FileStore
from flightrec.db.fold import RawMessage, fold
from flightrec.schemas import Lifecycle, LogBatch, encode

from flightrec.cli import build_parser

DAEMON = "/tmp/pytest-of-someone/run-42/.flightrec/demo/runs/20261202-101010/h100-01/prover-daemon.log"
T0 = 1_750_000_000_000_000


def _walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                missing += _walk(sub, f"{path} {name}")
        elif isinstance(action, argparse._HelpAction):
            continue
        elif not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_option_and_argument_of_every_command_has_help():
    assert _walk(build_parser(), "flightrec") == []


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    """A database with one instance's life: a few lifecycle events and many lines of three sources, folded and
    committed by the materializer's own fold() and FileStore (the derived tables come out of derive.py)."""
    path = tmp_path_factory.mktemp("manners") / "fleet.duckdb"
    events: list = []

    def add(cls: type, ts_us: int, **fields: object) -> None:
        events.append(
            cls(event_id=f"e{len(events)}", instance_id="h100-01", boot_id="b1", seq=len(events), ts_us=ts_us, **fields)
        )

    for stage, state in [("tunnel", "started"), ("tunnel", "succeeded"), ("benchmark", "started")]:
        add(Lifecycle, T0 + len(events), stage=stage, state=state)
    for k, source in enumerate(("stdout", "stderr", DAEMON)):  # line i of 3000 goes to source i % 3
        nos = list(range(k, 3000, 3))
        add(
            LogBatch,
            T0 + 1000 + nos[-1],
            stage="benchmark",
            source=source,
            pid=100,
            line_no=nos,
            line_ts_us=[T0 + 1000 + i for i in nos],
            text=[f"proof {i} done" for i in nos],
            truncated=[False] * len(nos),
            invalid_utf8=[False] * len(nos),
        )
    add(Lifecycle, T0 + 5000, stage="benchmark", state="failed")
    delta = fold([RawMessage(e.topic, 0, n, e.instance_id.encode(), encode(e)) for n, e in enumerate(events)])
    assert delta.dead.num_rows == 0, delta.dead.to_pylist()
    store = FileStore(path, "test")
    try:
        store.commit(delta)
    finally:
        store.close()
    return path


def _flightrec() -> str:
    return str(Path(sys.executable).with_name("flightrec"))


@pytest.mark.parametrize(
    "command, head",
    [
        ("sql --db {db} 'SELECT * FROM range(200000)'", 1),
        ("timeline h100-01 --db {db} --max-lines 0", 5),
    ],
)
def test_a_closed_pipe_ends_quietly(db, command, head):
    cmd = f"{_flightrec()} {command.format(db=db)} | head -{head}"
    r = subprocess.run(
        ["bash", "-o", "pipefail", "-c", cmd],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1", "HOME": str(db.parent)},
    )
    assert len(r.stdout.splitlines()) == head
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert r.returncode in (0, 141), (r.returncode, r.stderr)  # 141: SIGPIPE, as `yes | head -1` ends


def test_timeline_shows_each_file_path_once_in_a_legend(db):
    r = subprocess.run(
        [_flightrec(), "timeline", "h100-01", "--db", str(db), "--max-lines", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1"},
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.count(DAEMON) == 1, "the full path belongs in the legend only"
    legend = [line for line in out.splitlines() if DAEMON in line][0]
    short = legend.split()[0]
    assert short.startswith("prover-daemon.log") or short.startswith("[")
    body = [line for line in out.splitlines() if "proof 2 done" in line]
    assert body and "prover-daemon.log" in body[0]
    assert max(len(line) for line in out.splitlines() if " log " in line) < 120
    assert "\x1b[" not in out  # no colour when stdout is not a terminal


@pytest.mark.parametrize("no_color", [False, True])
def test_colour_only_on_a_terminal_and_never_with_no_color(db, no_color):
    leader, follower = pty.openpty()
    env = {"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1", **({"NO_COLOR": "1"} if no_color else {})}
    proc = subprocess.Popen(
        [_flightrec(), "timeline", "h100-01", "--db", str(db), "--max-lines", "5"],
        stdout=follower,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end closed
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    assert b"benchmark" in out and (b"\x1b[" in out) == (not no_color)
