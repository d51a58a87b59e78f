"""Any bytes in names: non-UTF-8 argv, working folder, --tail paths and environment never stop the command.

Checked at the agent's spool (``spool_env``); the non-UTF-8 instance id, which is also the Kafka key,
goes through the real broker (``agent_env``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
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


@pytest.mark.slow
@pytest.mark.parametrize("instance", ["..", ".", "../escape", "a/../../b", "%2E%2E", "x" * 300])
def test_no_instance_id_leaves_the_spool_folder(spool_env, tmp_path: Path, instance: str) -> None:
    root = tmp_path / "box" / "spool"
    root.mkdir(parents=True)
    env = spool_env.env(FLIGHTREC_SPOOL=str(root), FLIGHTREC_INSTANCE=instance)
    r = spool_env.run("event", "--stage", "s", "--state", "info", "--detail", "named", env=env)
    assert r.returncode == 0, r.stderr
    segments = list((tmp_path / "box").rglob("*.seg"))
    assert segments, "nothing was spooled"
    for seg in segments:  # every segment in a folder of its own directly under the spool root
        assert seg.parent.parent == root and seg.parent.name not in (".", ".."), seg
    assert not (tmp_path / "box" / "lock").exists() and not (root / "lock").exists()
    listed = spool_env.run("flush", "--all", env=env)  # the flush of every instance finds it (and cannot send it)
    assert listed.returncode == 1 and b"left" in listed.stdout + listed.stderr, listed


@pytest.mark.parametrize("source", ["..", "."])
def test_no_manager_source_leaves_the_spool_folder(spool_env, tmp_path: Path, source: str) -> None:
    import subprocess

    root = tmp_path / "box" / "spool"
    root.mkdir(parents=True)
    env = spool_env.env(FLIGHTREC_SPOOL=str(root))
    r = subprocess.run(
        [spool_env.argv("event")[0], "manager", "event", "--instance", "i-1", "--kind", "note", "--source", source],
        env=env,
        capture_output=True,
        timeout=60,
    )
    segments = list((tmp_path / "box").rglob("*.seg"))
    assert segments, r.stderr
    for seg in segments:  # <spool>/manager/<source>/<instance>/NNN.seg
        source_dir = seg.parent.parent
        assert source_dir.parent == root / "manager" and source_dir.name not in (".", ".."), seg


@pytest.mark.slow
def test_flush_all_finds_the_manager_s_undelivered_events(spool_env, tmp_path: Path) -> None:
    """`agent flush --all --spool $SPOOL/manager` (and `--spool $SPOOL`) sees every manager source's spool."""
    import subprocess

    root = tmp_path / "spool"
    env = spool_env.env(FLIGHTREC_SPOOL=str(root))
    exe = spool_env.argv("event")[0]
    r = subprocess.run(
        [exe, "manager", "event", "--instance", "i-1", "--kind", "destroyed", "--source", "mgr-a"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert b"not yet delivered" in r.stdout + r.stderr  # nothing listens: it waits in the manager's spool
    for where in (root / "manager", root):
        f = subprocess.run(
            [exe, "agent", "flush", "--all", "--timeout", "1", "--spool", str(where)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert f.returncode == 1, (where, f.stdout, f.stderr)
        assert "i-1: 0 events delivered, 1 left in" in f.stdout and "mgr-a" in f.stdout, (where, f.stdout)
    empty = subprocess.run(
        [exe, "agent", "flush", "--all", "--spool", str(tmp_path / "nothing")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert empty.returncode == 0 and "no spooled instances" in empty.stdout + empty.stderr


@pytest.mark.slow
def test_an_instance_named_manager_hides_no_manager_event_from_flush_all(spool_env, tmp_path: Path) -> None:
    """(Found by review.) <spool>/manager is both that instance's folder and the manager's sources' root."""
    import subprocess

    root = tmp_path / "spool"
    env = spool_env.env(FLIGHTREC_SPOOL=str(root))
    exe = spool_env.argv("event")[0]
    subprocess.run(
        [exe, "manager", "event", "--instance", "gpu-1", "--kind", "destroyed", "--source", "mgr-a"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert spool_env.run("event", "--instance", "manager", "--stage", "s", "--state", "info", env=env).returncode == 0
    f = subprocess.run(
        [exe, "agent", "flush", "--all", "--timeout", "1", "--spool", str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "gpu-1: 0 events delivered, 1 left in" in f.stdout and "manager: 0 events delivered" in f.stdout, f.stdout
