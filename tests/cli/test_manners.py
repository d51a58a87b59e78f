"""CLI manners: help on every option, no traceback into a closed pipe, short source names in `timeline`."""

from __future__ import annotations

import argparse
import os
import pty
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from flightrec.cli import build_parser
from flightrec.consumers.store import Store

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
    """A database with one instance's life: a few lifecycle events and many lines of three sources."""
    path = tmp_path_factory.mktemp("manners") / "fleet.duckdb"
    Store(path, "test").close()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO instances (instance_id, boot_id, stage, state) VALUES ('h100-01', 'b1', 'benchmark', "
                "'failed')")
    for seq, (stage, state) in enumerate([("tunnel", "started"), ("tunnel", "succeeded"), ("benchmark", "started"),
                                                    ("benchmark", "failed")]):
        con.execute("INSERT INTO lifecycle_events (event_id, instance_id, boot_id, seq, ts_us, kind, stage, state) "
                    "VALUES (?, 'h100-01', 'b1', ?, ?, 'lifecycle', ?, ?)", [f"e{seq}", seq, T0 + seq, stage, state])
    con.execute(f"""INSERT INTO log_lines (instance_id, boot_id, event_id, seq, stage, source, line_no, ts_us, text)
                    SELECT 'h100-01', 'b1', 'l', 10 + i // 100, 'benchmark',
                           CASE i % 3 WHEN 0 THEN 'stdout' WHEN 1 THEN 'stderr' ELSE '{DAEMON}' END,
                           i, {T0} + 1000 + i, 'proof ' || i || ' done' FROM range(3000) t(i)""")
    con.close()
    return path


def _flightrec() -> str:
    return str(Path(sys.executable).with_name("flightrec"))


@pytest.mark.parametrize("command, head", [
    ("sql --db {db} 'SELECT * FROM range(200000)'", 1),
    ("timeline h100-01 --db {db} --max-lines 0", 5),
])
def test_a_closed_pipe_ends_quietly(db, command, head):
    cmd = f"{_flightrec()} {command.format(db=db)} | head -{head}"
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1", "HOME": str(db.parent)})
    assert len(r.stdout.splitlines()) == head
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert r.returncode in (0, 141), (r.returncode, r.stderr)  # 141: SIGPIPE, as `yes | head -1` ends


def test_timeline_shows_each_file_path_once_in_a_legend(db):
    r = subprocess.run([_flightrec(), "timeline", "h100-01", "--db", str(db), "--max-lines", "0"],
                       capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1"})
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
    proc = subprocess.Popen([_flightrec(), "timeline", "h100-01", "--db", str(db), "--max-lines", "5"],
                            stdout=follower, stderr=subprocess.DEVNULL, env=env)
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
