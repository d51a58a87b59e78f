"""Any bytes in names: non-UTF-8 argv, working folder, --tail paths and environment never stop the command.

Checked at the agent's spool (``spool_env``); the non-UTF-8 instance id, which is also the Kafka key,
goes through the real broker (``agent_env``)."""

from __future__ import annotations

import os
from pathlib import Path

from flightrec.schemas import Lifecycle, ProcessExit



def test_a_non_utf8_argument(spool_env) -> None:
    r = spool_env.run("run", "--stage", "s", "--", b"echo", b"caf\xe9")
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"caf\xe9\n"  # the command got its bytes unchanged
    (ex,) = spool_env.of(ProcessExit)
    assert ex.exit_code == 0 and ex.argv == ("echo", "caf\\xe9")
    started = spool_env.of(Lifecycle)[0]
    assert started.attributes["argv"] == "echo 'caf\\xe9'"
    assert "attributes.argv" in started.attributes["invalid_utf8"]
    assert spool_env.lines("stdout") == [(1, "caf\\xe9", False, True)]


def test_a_non_utf8_working_folder(spool_env, tmp_path: Path) -> None:
    d = os.path.join(os.fsencode(tmp_path), b"d\xff")
    os.mkdir(d)
    r = spool_env.run("run", "--stage", "s", "--", "sh", "-c", "exit 4", cwd=d)
    assert r.returncode == 4, r.stderr
    started = spool_env.of(Lifecycle)[0]
    assert started.attributes["cwd"] == str(tmp_path) + "/d\\xff"
    assert started.attributes["invalid_utf8"] == "attributes.cwd"
    assert [e.exit_code for e in spool_env.of(ProcessExit)] == [4]


def test_a_non_utf8_tail_path(spool_env, tmp_path: Path) -> None:
    log = os.path.join(os.fsencode(tmp_path), b"log\xff")
    r = spool_env.run("run", "--stage", "s", "--tail", log, "--", "sh", "-c", b'echo hello > "$0"; exit 3', log)
    assert r.returncode == 3, r.stderr
    (ex,) = spool_env.of(ProcessExit)
    assert ex.exit_code == 3
    assert ex.file_tails[0].path == str(tmp_path) + "/log\\xff"
    assert ex.file_tails[0].exists and ex.file_tails[0].lines == ("hello",)
    assert spool_env.lines(str(tmp_path) + "/log\\xff") == [(1, "hello", False, False)]


def test_a_non_utf8_environment(spool_env) -> None:
    env = spool_env.env()
    envb = {k.encode(): v.encode() for k, v in env.items()}
    envb[b"TOKEN"] = b"tok\xff-secret-value"
    envb[b"FLIGHTREC_REDACT"] = b"TOKEN"
    envb[b"ODD\xfe"] = b"x\xfd"
    r = spool_env.run("run", "--stage", "s", "--", "sh", "-c", 'echo "$TOKEN"; exit 5', env=envb)
    assert r.returncode == 5, r.stderr
    assert r.stdout == b"tok\xff-secret-value\n"
    assert [e.exit_code for e in spool_env.of(ProcessExit)] == [5]
    assert spool_env.lines("stdout") == [(1, "***", False, True)]


def test_a_non_utf8_instance_id(agent_env) -> None:
    envb = {k.encode(): v.encode() for k, v in agent_env.env().items()}
    envb[b"FLIGHTREC_INSTANCE"] = agent_env.instance.encode() + b"\xff"
    r = agent_env.run("run", "--stage", "s", "--", "sh", "-c", "exit 6", env=envb)
    assert r.returncode == 6, r.stderr
    assert [e.exit_code for e in agent_env.of(ProcessExit, instance=agent_env.instance + "\\xff")] == [6]
