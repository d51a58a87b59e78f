"""What `agent run` ships: followed files (daemon log, rotation, truncation), huge lines, bad UTF-8, secrets.

What the agent makes of lines is checked at its spool (``spool_env``); the late daemon lines, the masking
of what leaves for Kafka and a burst that must stay deliverable go through the real broker (``agent_env``)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from flightrec.schemas import Lifecycle, LogBatch, ProcessExit

PY = sys.executable

BENCHMARK = r"""
import subprocess, sys, time
log = sys.argv[1]
# the proving daemon: starts after a while, writes its error ONLY to its own log file, dies after CMD exited
daemon = r'''
import sys, time
time.sleep(0.4)
with open(sys.argv[1], "a") as f:
    f.write("daemon: loading params\n"); f.flush()
    time.sleep(0.6)
    f.write("daemon: CUDA error 2: out of memory at msm.cu:118\n"); f.flush()
'''
subprocess.Popen([sys.executable, "-c", daemon, log], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                 start_new_session=True)
time.sleep(0.7)
print("benchmark: 0 proofs in 0.7 s", flush=True)
print("benchmark exited with error", file=sys.stderr)
sys.exit(1)
"""


def test_daemon_error_only_in_followed_file_is_in_the_exit_tail(agent_env, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"  # does not exist when the stage starts: it is waited for
    r = agent_env.run(
        "run",
        "--stage",
        "benchmark",
        "--tail",
        str(log),
        "--tail",
        str(tmp_path / "never.log"),
        "--",
        PY,
        "-c",
        BENCHMARK,
        str(log),
    )
    assert r.returncode == 1
    ex = agent_env.of(ProcessExit)[0]
    tails = {t.path: t for t in ex.file_tails}
    assert tails[str(tmp_path / "never.log")].exists is False
    assert ex.stderr_tail == ("benchmark exited with error",)
    # the daemon (started by the stage) still had the log open when CMD exited: its last words come late
    got = agent_env.wait_for_line(str(log), "CUDA error")
    assert [t for _, t, _ in got] == ["daemon: loading params", "daemon: CUDA error 2: out of memory at msm.cu:118"]
    assert got[-1][2] is True
    assert [n for n, _, _ in got] == [1, 2]


ROTATE = r"""
import os, sys, time
log = sys.argv[1]
def write(lines, mode="a"):
    with open(log, mode) as f:
        for l in lines:
            f.write(l + "\n")
    time.sleep(0.4)
write([f"line {i}" for i in range(1, 6)])
os.rename(log, log + ".1")                      # logrotate: move away, a new file appears
with open(log + ".1", "a") as f:
    f.write("line 6 (late write to the old file)\n")
write([f"line {i}" for i in range(7, 11)])
write([], mode="w")                             # copytruncate
write([f"line {i}" for i in range(11, 13)])
print("done")
"""


def test_followed_file_rotation_and_truncation(spool_env, tmp_path: Path) -> None:
    log = tmp_path / "app.log"
    r = spool_env.run("run", "--stage", "s", "--tail", str(log), "--", PY, "-c", ROTATE, str(log))
    assert r.returncode == 0, r.stderr
    texts = [t for _, t, *_ in spool_env.lines(str(log))]
    assert texts == [f"line {i}" for i in range(1, 6)] + ["line 6 (late write to the old file)"] + [
        f"line {i}" for i in range(7, 13)
    ]
    nos = [n for n, *_ in spool_env.lines(str(log))]
    assert nos == list(range(1, len(nos) + 1))


def test_a_10_mb_line_is_cut_and_flagged(spool_env) -> None:
    code = "import sys; w=sys.stdout.buffer.write; w(b'before\\n'); w(b'x' * 10_000_000 + b'\\n'); w(b'after\\n')"
    r = spool_env.run("run", "--stage", "s", "--", PY, "-c", code)
    assert r.returncode == 0
    assert (
        hashlib.sha256(r.stdout).hexdigest()
        == hashlib.sha256(b"before\n" + b"x" * 10_000_000 + b"\nafter\n").hexdigest()
    )
    out = spool_env.lines("stdout")
    assert [(n, len(t), cut) for n, t, cut, _ in out] == [(1, 6, False), (2, 65536, True), (3, 5, False)]
    assert out[1][1] == "x" * 65536
    ex = spool_env.of(ProcessExit)[0]
    assert ex.stdout_tail[-1] == "after" and ex.stdout_tail[1].endswith("[cut]")  # tails stay small


def test_invalid_utf8_is_kept_visibly_and_flagged(spool_env) -> None:
    code = r"import sys; sys.stdout.buffer.write(b'ok \xc3\xa9\nbad \xff\xfe end\nlatin1 caf\xe9\n')"
    r = spool_env.run("run", "--stage", "s", "--", PY, "-c", code)
    assert r.returncode == 0
    assert [(t, inv) for _, t, _, inv in spool_env.lines("stdout")] == [
        ("ok é", False),
        ("bad \\xff\\xfe end", True),
        ("latin1 caf\\xe9", True),
    ]


def test_progress_bar_does_not_flood(spool_env) -> None:
    code = (
        "import sys\nfor i in range(1001):\n    sys.stdout.write(f'\\rfetching params {i/10:.1f}%')\n"
        "print()\nprint('fetched')"
    )
    r = spool_env.run("run", "--stage", "params", "--", PY, "-c", code)
    assert r.returncode == 0 and r.stdout.count(b"\r") == 1001
    assert [t for _, t, *_ in spool_env.lines("stdout")] == ["fetching params 100.0%", "fetched"]


def test_secrets_in_env_and_urls_are_masked(agent_env) -> None:
    secret = "tok_7f3a9c2e51d04b"
    code = (
        "import os,sys; t=os.environ['MANAGER_TOKEN']; print('token is', t); "
        "print('GET https://operator:hunter2pass@manager.example/register', file=sys.stderr)"
    )
    env = agent_env.env(MANAGER_TOKEN=secret, FLIGHTREC_REDACT="MANAGER_TOKEN,UNSET_VAR")
    r = agent_env.run("run", "--stage", "register", "--", PY, "-c", code, f"--token={secret}", env=env)
    assert r.returncode == 0
    assert secret.encode() in r.stdout  # the local terminal sees the real output: only what leaves is masked
    assert [t for _, t, *_ in agent_env.lines("stdout")] == ["token is ***"]
    assert [t for _, t, *_ in agent_env.lines("stderr")] == ["GET https://***:***@manager.example/register"]
    everything = b"".join(m.value for m in agent_env.kafka.consume() if m.key == agent_env.instance.encode())
    assert secret.encode() not in everything and b"hunter2pass" not in everything
    ex = agent_env.of(ProcessExit)[0]
    assert ex.argv[-1] == "--token=***" and ex.stdout_tail == ("token is ***",)
    started = agent_env.of(Lifecycle)[0]
    assert secret not in started.attributes["argv"]


def test_many_lines_come_in_few_batches_in_order(spool_env) -> None:
    r = spool_env.run("run", "--stage", "s", "--", PY, "-c", "for i in range(50000): print(f'line {i}')")
    assert r.returncode == 0
    batches = [b for b in spool_env.of(LogBatch) if b.source == "stdout"]
    texts = [t for b in batches for t in b.text]
    assert texts == [f"line {i}" for i in range(50000)]
    assert len(batches) < 100  # thousands of lines per message, not one message per line


def test_a_burst_of_empty_lines_is_split_into_deliverable_batches(agent_env, tmp_path: Path) -> None:
    # 2M empty lines cost ~14 bytes each once encoded (number, time, flags): one LogBatch per 1 MiB
    # chunk would be ~14 MB, over aiokafka's max_request_size; it must never block delivery
    src, log = tmp_path / "blank.src", tmp_path / "blank.log"  # the stage writes the followed file
    src.write_bytes(b"\n" * 2_000_000 + b"last\n")
    r = agent_env.run(
        "run",
        "--stage",
        "s",
        "--tail",
        str(log),
        "--",
        "cp",
        str(src),
        str(log),
        env=agent_env.env(FLIGHTREC_FLUSH_TIMEOUT="15"),
    )
    assert r.returncode == 0
    assert b"not yet acknowledged" not in r.stderr, r.stderr.decode()[-2000:]
    out = agent_env.lines(str(log))
    assert len(out) == 2_000_001 and out[-1][:2] == (2_000_001, "last")
    assert [n for n, *_ in out] == list(range(1, 2_000_002))
