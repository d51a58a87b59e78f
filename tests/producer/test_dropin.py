"""`agent run` as a true drop-in: daemons that outlive their stage, signals once, terminals, pkill -f, exec like sh.

Checks of the agent alone read its spool (``spool_env``); daemons, late lines and what the materializer makes
of them go through the real broker (``agent_env``), and so do the terminal tests (the terminal shows
everything the agent writes, its lines about a broker that is away included)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest
from flightrec.schemas import LogBatch, ProcessExit

PY = sys.executable

# a daemon that prints a numbered line every 50 ms for 5 s, on the stdout it inherited; each line one write (print
# writes the line and its newline apart where PYTHONUNBUFFERED is set, and the stage's echo could land between them)
DAEMON = r"""
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
for i in range(1, 101):
    os.write(1, f"daemon line {i}\n".encode())
    time.sleep(0.05)
"""
STAGE = """
"$PY" -c "$DAEMON" "$PIDFILE" &
sleep 0.3
echo "stage: started the daemon, exiting 1"
date +%s.%N > "$ENDFILE"
exit 1
"""


def materialize(kafka: Any, db: Path) -> None:
    """The materializer in-process until idle, from the test's mark of the topics (``Kafka.seed_at_mark``)."""
    from flightrec.consumers.materializer import Materializer, Options

    kafka.seed_at_mark(db)

    async def go() -> Any:
        async with Materializer(kafka.settings.kafka_kwargs(), Options(db=str(db), until_idle=1.5)) as m:
            return await m.run()

    asyncio.run(go())


def query(db: Path, sql: str, *params: Any) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


def run_to_files(argv: list[str], env: dict[str, str], tmp: Path, name: str) -> tuple[int, float, Path]:
    """Run with stdout and stderr into files (as in a container's log); return (code, end time, stdout file)."""
    out = tmp / f"{name}.out"
    with open(out, "wb") as o, open(tmp / f"{name}.err", "wb") as e:
        code = subprocess.run(argv, env=env, stdout=o, stderr=e, timeout=120).returncode
    return code, time.time(), out


def test_a_daemon_outlives_its_stage_and_is_recorded_late(agent_env, tmp_path: Path) -> None:
    base = dict(PY=PY, DAEMON=DAEMON)
    direct_env = {**os.environ, **base, "PIDFILE": str(tmp_path / "d.pid"), "ENDFILE": str(tmp_path / "d.end")}
    code, _, direct_out = run_to_files(["sh", "-c", STAGE], direct_env, tmp_path, "direct")
    assert code == 1
    wait_gone(int((tmp_path / "d.pid").read_text()))

    env = agent_env.env(**base, PIDFILE=str(tmp_path / "a.pid"), ENDFILE=str(tmp_path / "a.end"))
    code, ended, agent_out = run_to_files(
        agent_env.argv("run", "--stage", "benchmark", "--", "sh", "-c", STAGE), env, tmp_path, "agent"
    )
    assert code == 1
    script_ended = float((tmp_path / "a.end").read_text())
    # the agent's own exit latency, from the timestamp the script wrote as it exited (~0.2-0.6 s on a loaded
    # 2-core machine: the pipes' 0.1 s grace, the hand-off, Kafka's acknowledgement of the exit events)
    assert ended - script_ended < 1.0, f"the agent exited {ended - script_ended:.2f}s after its command"
    daemon = int((tmp_path / "a.pid").read_text())
    time.sleep(3)
    assert alive(daemon), "the daemon was killed after its stage ended"
    wait_gone(daemon)
    # what reached the file is what the command and its daemon wrote, without the agent too
    want = direct_out.read_text().splitlines()
    got = agent_out.read_text().splitlines()
    assert Counter(got) == Counter(want) and len(want) == 101
    assert [x for x in got if x.startswith("daemon")] == [f"daemon line {i}" for i in range(1, 101)]

    lines = agent_env.wait_for_line("stdout", "daemon line 100")
    db = tmp_path / "fr.duckdb"
    materialize(agent_env.kafka, db)
    rows = query(
        db,
        """SELECT text, count(*), bool_or(late), any_value(stage) FROM log_lines
                        WHERE instance_id = ? AND source = 'stdout' GROUP BY text""",
        agent_env.instance,
    )
    by_text = {t: (n, late, stage) for t, n, late, stage in rows}
    for i in range(1, 101):
        n, _late, stage = by_text[f"daemon line {i}"]
        assert n == 1 and stage == "benchmark"
    assert by_text["daemon line 100"][1] is True  # written ~4.5 s after the stage's command exited
    assert by_text["stage: started the daemon, exiting 1"][1] is False
    assert [n for n, _, _ in lines] == list(range(1, 102))


# each command wrapped stage by stage, as `${AGENT:+...}` does in the images; without AGENT: the plain script
W = "${AGENT:+$AGENT agent run --stage %s --}"
CURIO = f"""
set -euo pipefail
{W % "curio"} "$PY" -c 'import time, signal, sys
signal.signal(signal.SIGTERM, lambda *a: (print("curio: graceful shutdown", flush=True), sys.exit(0)))
print("curio: running", flush=True)
time.sleep(30)' &
PID=$!
sleep 2
echo "stage: stopping curio"
kill -15 $PID || kill -9 $PID
wait $PID || true
exec {W % "last"} sh -c 'echo "stage: last command"; exit 3'
"""

CUZK = f"""
{W % "daemon"} "$PY" -c 'import time
for i in range(400):
    print(f"cuzk-daemon: tick {{i}}", flush=True); time.sleep(0.05)' > "$LOGFILE" 2>&1 &
DPID=$!
{W % "bench"} timeout 2 "$PY" -c 'import time; print("bench: proving", flush=True); time.sleep(30)' \
|| echo "bench: timed out"
pkill -9 -f 'cuzk-daemon' || true
kill $DPID 2>/dev/null; wait $DPID 2>/dev/null
echo "stage: done"
exit 4
"""


@pytest.mark.parametrize(
    "script, code, failures",
    [
        (CURIO, 3, {("last", 3, None)}),
        (CUZK, 4, {("bench", 124, None), ("daemon", None, 9)}),
    ],
    ids=["curio", "cuzk"],
)
def test_real_entrypoint_patterns_behave_as_without_the_agent(
    agent_env, tmp_path: Path, script: str, code: int, failures: set
) -> None:
    log = tmp_path / "cuzk.log"
    env = agent_env.env(PY=PY, LOGFILE=str(log))
    stage = tmp_path / "stage.sh"  # a script file, as in the images: `pkill -f cuzk-daemon` matches the daemon only
    stage.write_text(script)
    direct = subprocess.run(["bash", str(stage)], env=env, capture_output=True, timeout=120)
    direct_log = log.read_bytes() if log.exists() else b""
    r = subprocess.run(
        ["bash", str(stage)], env={**env, "AGENT": agent_env.argv("run")[0]}, capture_output=True, timeout=120
    )
    assert (direct.returncode, r.returncode) == (code, code), r.stderr
    assert r.stdout == direct.stdout
    if direct_log:  # the daemon's output file: the same ticks, however many it got to write before pkill
        assert log.read_bytes().startswith(b"cuzk-daemon: tick 0\n")
    db = tmp_path / "fr.duckdb"
    materialize(agent_env.kafka, db)
    rows = query(
        db, "SELECT stage, exit_code, signal, failure_class FROM failures WHERE instance_id = ?", agent_env.instance
    )
    assert {r[:3] for r in rows} == failures
    assert all(r[3] for r in rows)


# counts every delivery: Python's C-level handler writes one byte per signal to the wakeup fd
SIGNALS = r"""
import os, signal, sys, time
r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda n, f: None)
open(sys.argv[1], "w").write("ready")
deadline = time.time() + 3
while time.time() < deadline:
    pass  # busy, so that a signal is taken at once (a sleeping process may let two merge into one)
os.set_blocking(r, False)
print(" ".join(signal.Signals(n).name for n in os.read(r, 100)), flush=True)
"""


def _start_signals(agent_env, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    ready = tmp_path / "ready"
    p = subprocess.Popen(
        agent_env.argv("run", "--stage", "s", "--", PY, "-c", SIGNALS, str(ready)),
        env=agent_env.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # no terminal, as an entrypoint in a container
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists()
    return p, ready


@pytest.mark.slow
def test_sigterm_to_the_agent_alone_reaches_cmd_once(spool_env, tmp_path: Path) -> None:
    p, _ = _start_signals(spool_env, tmp_path)
    os.kill(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert out.decode().split() == ["SIGTERM"], err.decode()[-2000:]


TERMINAL_SIGNALS = SIGNALS.replace(
    'open(sys.argv[1], "w").write("ready")',
    'open(sys.argv[1], "w").write("ready")\nprint("tty", os.isatty(1), flush=True)',
)


def _pty_run(
    argv: list[str], env: dict[str, str], *, send: bytes = b"", ready: Path | None = None, cols: int = 0
) -> tuple[int, bytes]:
    """Run ``argv`` as a session leader on a new pseudo-terminal (a terminal window); return (code, bytes seen)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    if cols:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))

    def ctty() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    p = subprocess.Popen(
        argv, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, preexec_fn=ctty
    )
    os.close(slave)
    seen = b""
    sent = not send
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if not sent and ready is not None and ready.exists():
            os.write(master, send)
            sent = True
        try:
            import select

            if select.select([master], [], [], 0.05)[0]:
                data = os.read(master, 65536)
                if not data:
                    break
                seen += data
        except OSError:
            break
        if p.poll() is not None and not select.select([master], [], [], 0.2)[0]:
            break
    os.close(master)
    return p.wait(timeout=60), seen


def test_ctrl_c_to_the_terminal_s_process_group_reaches_cmd_once(agent_env, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code, seen = _pty_run(
        agent_env.argv("run", "--stage", "s", "--", PY, "-c", TERMINAL_SIGNALS, str(ready)),
        agent_env.env(),
        send=b"\x03",
        ready=ready,
    )
    text = seen.decode(errors="replace")
    assert re.findall(r"SIG[A-Z]+", text) == ["SIGINT"], text  # from the terminal; the agent did not add one
    # the terminal's echo of ^C lands wherever the command's output is at that moment
    assert code == 0 and "tty True" in text.replace("^C", ""), text


COLOURS = r"""
import os, shutil, sys
sys.stdout.write("isatty=%s cols=%d\n" % (os.isatty(1), shutil.get_terminal_size().columns))
sys.stdout.write("\x1b[31mred\x1b[0m plain\n")
sys.stdout.write("progress 10%\rprogress 100%\n")
sys.stdout.flush()
"""


def test_a_terminal_stays_a_terminal(agent_env, tmp_path: Path) -> None:
    argv = ["-c", COLOURS]
    # the size comes from the terminal, as in a terminal window: not from a COLUMNS/LINES the test runner has
    # (pytest-xdist's workers have COLUMNS=80), which shutil.get_terminal_size() would take first
    env = {k: v for k, v in agent_env.env().items() if k not in ("COLUMNS", "LINES")}
    _, direct = _pty_run([PY, *argv], env, cols=97)
    code, seen = _pty_run(agent_env.argv("run", "--stage", "tty", "--", PY, *argv), env, cols=97)
    assert code == 0
    assert b"isatty=True cols=97" in seen
    assert seen == direct  # byte for byte what the command wrote (the terminal's own \r\n included)
    texts = [t for _, t, *_ in agent_env.lines("stdout")]
    assert texts == ["isatty=True cols=97", "red plain", "progress 100%"]  # colours kept out of the record


def test_piped_output_stays_a_pipe(spool_env) -> None:
    r = spool_env.run("run", "--stage", "p", "--", PY, "-c", "import os; print(os.isatty(1), os.isatty(2))")
    assert r.stdout == b"False False\n"


def test_pkill_f_does_not_match_the_agent(spool_env, tmp_path: Path) -> None:
    name = f"cuzk-daemon-{os.getpid()}"
    ready = tmp_path / "ready"
    p = subprocess.Popen(
        spool_env.argv(
            "run",
            "--stage",
            "bench",
            "--",
            PY,
            "-c",
            "import sys, time; open(sys.argv[1], 'w'); time.sleep(30)",
            str(ready),
            name,
        ),
        env=spool_env.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"flightrec-agent stage=bench")
    subprocess.run(["pkill", "-9", "-f", name], check=False)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + 9, err.decode()[-2000:]  # the command was killed, the agent reported it
    (ex,) = spool_env.of(ProcessExit)
    assert (ex.stage, ex.signal) == ("bench", 9)


def test_a_script_without_shebang_runs_under_sh(spool_env, tmp_path: Path) -> None:
    script = tmp_path / "noshebang"
    script.write_text('echo "no shebang $1"\nexit 5\n')
    script.chmod(0o755)
    direct = subprocess.run(["sh", "-c", f'"{script}" x'], capture_output=True)
    r = spool_env.run("run", "--stage", "s", "--", str(script), "x")
    assert (direct.returncode, r.returncode) == (5, 5), r.stderr
    assert r.stdout == direct.stdout == b"no shebang x\n"
    missing = spool_env.run("run", "--stage", "s", "--", str(tmp_path / "nope"))
    script.chmod(0o644)
    not_exec = spool_env.run("run", "--stage", "s", "--", str(script))
    assert (missing.returncode, not_exec.returncode) == (127, 126)


def test_a_followed_fifo_never_blocks_the_agent(spool_env, tmp_path: Path) -> None:
    fifo = tmp_path / "daemon.fifo"
    os.mkfifo(fifo)
    r = spool_env.run("run", "--stage", "s", "--tail", str(fifo), "--", "sh", "-c", "exit 7", timeout=60)
    assert r.returncode == 7


def test_a_big_existing_followed_file_ships_only_new_lines(spool_env, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    with open(log, "wb") as f:
        line = b"old line from an earlier boot " + b"x" * 70 + b"\n"
        f.write(line * (100 * 1024 * 1024 // len(line)))
    r = spool_env.run(
        "run",
        "--stage",
        "s",
        "--tail",
        str(log),
        "--",
        "sh",
        "-c",
        f'echo "new line 1" >> "{log}"; echo "new line 2" >> "{log}"',
    )
    assert r.returncode == 0
    assert [(n, t) for n, t, *_ in spool_env.lines(str(log))] == [(1, "new line 1"), (2, "new line 2")]
    (ex,) = spool_env.of(ProcessExit)
    assert ex.file_tails[0].lines == ("new line 1", "new line 2")


# the seed: the stage script exits 1 at once; its daemon logs every 0.4 s and says why ~5 s later
SEED_DAEMON = r"""
import sys, time
with open(sys.argv[1], "a") as f:
    for i in range(1, 15):
        f.write(f"daemon: step {i}\n"); f.flush(); time.sleep(0.4)
    f.write("daemon: CUDA error: no kernel image is available for execution on the device\n"); f.flush()
"""


def test_the_delayed_decisive_line_is_classified(agent_env, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    log.write_text("daemon: an old line from before this stage\n")
    env = agent_env.env(PY=PY, DAEMON=SEED_DAEMON, LOG=str(log))
    # the entrypoint's first stage follows the daemon log too: no line may be stored twice nor under it
    assert agent_env.run("run", "--stage", "params", "--tail", str(log), "--", "true", env=env).returncode == 0
    r = agent_env.run(
        "run",
        "--stage",
        "benchmark",
        "--tail",
        str(log),
        "--",
        "sh",
        "-c",
        '"$PY" -c "$DAEMON" "$LOG" > /dev/null 2>&1 & sleep 0.2; echo "benchmark: failed" >&2; exit 1',
        env=env,
    )
    assert r.returncode == 1
    # the entrypoint's exit trap seals the boot at once: the seal waits for the late line
    assert agent_env.run("seal", env=env).returncode == 0
    lines = agent_env.wait_for_line(str(log), "no kernel image")
    texts = [t for _, t, _ in lines]
    assert texts == [f"daemon: step {i}" for i in range(1, 15)] + [
        "daemon: CUDA error: no kernel image is available for execution on the device"
    ]
    assert lines[-1][2] is True
    assert {b.stage for b in agent_env.of(LogBatch) if b.source == str(log)} == {"benchmark"}
    db = tmp_path / "fr.duckdb"
    materialize(agent_env.kafka, db)
    (row,) = query(db, "SELECT stage, failure_class FROM failures WHERE instance_id = ?", agent_env.instance)
    assert row == ("benchmark", "gpu_arch_unsupported")
    (n,) = query(
        db, "SELECT count(*) FROM log_lines WHERE instance_id = ? AND text LIKE '%no kernel image%'", agent_env.instance
    )[0]
    assert n == 1


# many stages leaving daemons behind
N_STAGES = 6
N_LINES = 40
# a daemon (a subshell: it carries the stage's token) printing a numbered line every 0.1 s on the inherited stdout
MANY_STAGE = f'(for i in $(seq 1 {N_LINES}); do echo "$NAME line $i"; sleep 0.1; done) & echo "$NAME: started"; exit 0'


def late_processes(spool: Path) -> dict[int, tuple[int, int]]:
    """pid -> (RSS in KiB, open fds) of every late-output process spooling under ``spool`` running now."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"late-output" not in cmd:
                continue
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            if not any(fd.startswith(str(spool)) for fd in fds):
                continue
            rss = next(
                int(x.split()[1])
                for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                if x.startswith("VmRSS:")
            )
            out[int(pid)] = (rss, len(fds))
        except (OSError, StopIteration):
            continue
    return out


def test_stages_leaving_daemons_share_one_bounded_late_output_process(agent_env, tmp_path: Path) -> None:
    seen: list[dict[int, tuple[int, int]]] = []
    for n in range(1, N_STAGES + 1):
        env = agent_env.env(NAME=f"d{n}")
        with open(tmp_path / "out", "ab") as out:  # a file, as a container's log: the run does not wait for it
            r = agent_env.run(
                "run",
                "--stage",
                f"s{n}",
                "--",
                "sh",
                "-c",
                MANY_STAGE,
                env=env,
                capture_output=False,
                stdout=out,
                stderr=out,
            )
        assert r.returncode == 0, (tmp_path / "out").read_text()[-2000:]
        seen.append(late_processes(agent_env.spool))
    deadline = time.monotonic() + 60
    while seen[-1] and time.monotonic() < deadline:  # until the last daemon ended
        time.sleep(0.2)
        seen.append(late_processes(agent_env.spool))
    assert max(len(s) for s in seen) == 1, f"late-output processes at once: {seen}"
    assert max(rss for s in seen for rss, _ in s.values()) < 150 * 1024
    assert max(fds for s in seen for _, fds in s.values()) < 2 * N_STAGES + 40
    pids = {pid for s in seen for pid in s}
    for pid in pids:
        deadline = time.monotonic() + 60
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(pid), "the late-output process did not end after the last holder closed"

    out = (tmp_path / "out").read_text().splitlines()
    assert all(out.count(f"d{n} line {i}") == 1 for n in range(1, N_STAGES + 1) for i in range(1, N_LINES + 1))
    agent_env.wait_for_line("stdout", f"d{N_STAGES} line {N_LINES}")
    db = tmp_path / "fr.duckdb"
    materialize(agent_env.kafka, db)
    rows = query(
        db,
        """SELECT stage, text, count(*), bool_or(late) FROM log_lines
                        WHERE instance_id = ? AND source = 'stdout' GROUP BY stage, text""",
        agent_env.instance,
    )
    got = {(stage, text): (count, late) for stage, text, count, late in rows}
    want = {(f"s{n}", f"d{n} line {i}") for n in range(1, N_STAGES + 1) for i in range(1, N_LINES + 1)}
    want |= {(f"s{n}", f"d{n}: started") for n in range(1, N_STAGES + 1)}
    assert set(got) == want
    assert all(count == 1 for count, _ in got.values())
    assert all(got[(f"s{n}", f"d{n} line {N_LINES}")][1] for n in range(1, N_STAGES + 1))


def test_a_seal_waits_for_the_late_output_of_every_stage(agent_env, tmp_path: Path) -> None:
    from flightrec.schemas import Sealed

    with open(tmp_path / "out", "ab") as out:
        for n in (1, 2):  # two stages of the boot whose daemons write for ~2 s after their stage ended
            stage = '(for i in $(seq 1 20); do echo "$NAME line $i"; sleep 0.1; done) & exit 0'
            r = agent_env.run(
                "run",
                "--stage",
                f"s{n}",
                "--",
                "sh",
                "-c",
                stage,
                env=agent_env.env(NAME=f"d{n}"),
                capture_output=False,
                stdout=out,
                stderr=out,
            )
            assert r.returncode == 0
    assert agent_env.run("seal").returncode == 0
    evs = agent_env.events()
    (sealed,) = [e for e in evs if isinstance(e, Sealed)]
    got = Counter((b.stage, t) for b in evs if isinstance(b, LogBatch) and b.seq < sealed.seq for t in b.text)
    assert got == Counter({(f"s{n}", f"d{n} line {i}"): 1 for n in (1, 2) for i in range(1, 21)})
