"""The single-file agent (`make agent-binary`) in a root filesystem without Python: the same events, exit codes and
signal behaviour as the pip-installed agent on the same stage, `agent flush` delivering its spool, nothing left in /tmp.

The file is built once per checkout state: `scripts/agent_binary.py --if-stale` keeps `dist/flightrec-agent` when it
is newer than every source (a build takes ~30 s; `make agent-binary`'s portable build serves as well). The root
filesystem holds the file, dash as /bin/sh, cat, true and sleep, the libraries they and the file need (ldd) and the C
library's own (GLIBC): no Python. It is entered with chroot, so the test needs root (CI runs as root); where that is
impossible it skips and says why.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flightrec.schemas import TOPICS, Event, LogBatch, decode

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "dist" / "flightrec-agent"
FLIGHTREC_AGENT = str(Path(sys.executable).parent / "flightrec-agent")  # pip's console script: the same argv
PROGRAMS = {"sh": "dash", "cat": "cat", "true": "true", "sleep": "sleep"}
# The C library's own files (Debian's libc6, which every glibc image holds whole) that the single file's loader and
# its bundled libraries may load from the system; PyInstaller bundles everything else. A libpython built against
# glibc < 2.34 (the portable build, Debian 11) names libutil, libdl and libpthread; a newer one only libc and libm.
GLIBC = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "libutil.so.1", "librt.so.1", "libresolv.so.2")
# Fields that differ by nature between two runs: ids, clocks, process ids, batching.
VOLATILE = {
    "event_id",
    "instance_id",
    "boot_id",
    "seq",
    "ts_us",
    "line_ts_us",
    "pid",
    "started_us",
    "ended_us",
    "duration_s",
}


@pytest.fixture(scope="session")
def agent_binary() -> Path:
    """`dist/flightrec-agent`, built once per session and kept when newer than its sources."""
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "agent_binary.py"), "--if-stale"], capture_output=True, timeout=900
    )
    assert p.returncode == 0, (p.stdout + p.stderr).decode()[-4000:]
    return BINARY


def _libs(program: str) -> list[str]:
    out = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    return [part for line in out.splitlines() for part in line.split() if part.startswith("/")]


@pytest.fixture(scope="module")
def rootfs(agent_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A root filesystem with the single file and a shell but no Python, its /proc mounted (the agent reads it)."""
    if os.geteuid() != 0:
        pytest.skip("entering a root filesystem without Python needs chroot, which needs root (CI runs as root)")
    root = tmp_path_factory.mktemp("rootfs")
    for d in ("bin", "tmp", "dev", "proc", "spool", "etc"):
        (root / d).mkdir()
    (root / "etc" / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")  # what a container runtime writes
    (root / "tmp").chmod(0o1777)
    libs = set(_libs(str(agent_binary)))  # the loader's own: the C library and zlib
    for name, src in PROGRAMS.items():
        path = shutil.which(src)
        assert path, f"{src} is not installed"
        shutil.copy(path, root / "bin" / name)
        libs.update(_libs(path))
    for lib in list(libs):
        if Path(lib).name == "libc.so.6":
            libs.update(str(Path(lib).parent / name) for name in GLIBC)
    for lib in libs:
        (root / lib.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(lib, root / lib.lstrip("/"))
    shutil.copy(agent_binary, root / "flightrec-agent")
    os.mknod(root / "dev" / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    assert not [p for p in root.rglob("*python*")], "the root filesystem must hold no Python"
    try:
        subprocess.run(["/bin/true"], check=True, capture_output=True, preexec_fn=lambda: os.chroot(root))
        subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True, capture_output=True)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot enter a root filesystem here (chroot or mounting /proc failed: {exc})")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")], check=False)


@dataclasses.dataclass
class Pair:
    """The same stage under the single file (in the root filesystem) and under the pip-installed agent."""

    kafka: Any
    root: Path
    work: str  # a folder at the same path inside the root filesystem and outside it

    def env(self, instance: str, bootstrap: str | None = None, spool: str = "/spool") -> dict[str, str]:
        return {
            "PATH": "/bin:/usr/bin",
            "FLIGHTREC_BOOTSTRAP": bootstrap if bootstrap is not None else self.kafka.bootstrap,
            "FLIGHTREC_SPOOL": spool,
            "FLIGHTREC_INSTANCE": instance,
            "FLIGHTREC_FLUSH_TIMEOUT": "30",
            "FLIGHTREC_LOG_LEVEL": "WARNING",
        }

    def binary(self, *args: str, instance: str, bootstrap: str | None = None, **kw: Any) -> subprocess.Popen:
        root = str(self.root)

        def enter() -> None:
            os.chroot(root)
            os.chdir("/")

        return subprocess.Popen(["/flightrec-agent", *args], env=self.env(instance, bootstrap), preexec_fn=enter, **kw)

    def pip(self, *args: str, instance: str, bootstrap: str | None = None, **kw: Any) -> subprocess.Popen:
        env = dict(os.environ, **self.env(instance, bootstrap, spool=str(self.root.parent / "pip-spool")))
        env["PATH"] = os.environ["PATH"]
        return subprocess.Popen([FLIGHTREC_AGENT, *args], env=env, cwd="/", **kw)

    def events(self, instance: str) -> list[Event]:
        evs = [decode(m.value) for m in self.kafka.consume(TOPICS) if m.key == instance.encode()]
        return sorted(evs, key=lambda e: (e.boot_id, e.seq))

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in (self.root / "tmp").iterdir() if p.name.startswith("_MEI"))


@pytest.fixture
def pair(kafka: Any, rootfs: Path) -> Iterator[Pair]:
    work = f"/tmp/flightrec-single-{uuid.uuid4().hex[:8]}"
    os.mkdir(work)
    os.mkdir(rootfs / work.lstrip("/"))
    try:
        yield Pair(kafka, rootfs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(rootfs / work.lstrip("/"), ignore_errors=True)


def _comparable(events: list[Event]) -> list[tuple[str, dict[str, Any]]]:
    """Each event's fields but the volatile ones; a source's log lines joined over its batches (batching is timing)."""
    out: list[tuple[str, dict[str, Any]]] = []
    lines: dict[tuple[str, str], dict[str, list[Any]]] = {}
    for ev in events:
        rec = {k: v for k, v in ev.to_record().items() if k not in VOLATILE}
        if isinstance(rec.get("attributes"), dict):
            rec["attributes"] = {k: v for k, v in rec["attributes"].items() if k not in VOLATILE}
        if isinstance(ev, LogBatch):
            joined = lines.setdefault((ev.stage, ev.source), {})
            for k in ("line_no", "text", "truncated", "invalid_utf8", "late"):
                joined.setdefault(k, []).extend(rec.pop(k) or [])
            continue
        out.append((type(ev).__name__, rec))
    out.sort(key=repr)  # the facts are probed beside the stage: their place in the boot is timing
    out.extend(("LogBatch", {"stage": s, "source": src, **v}) for (s, src), v in sorted(lines.items()))
    return out


def test_the_single_file_without_python_sends_what_the_pip_agent_sends(pair: Pair) -> None:
    log = f"{pair.work}/daemon.log"
    stage = (
        # the caller's environment, not the single file's loader's (its LD_LIBRARY_PATH, its _PYI_ variables)
        'echo "one ${LD_LIBRARY_PATH-} ${_PYI_APPLICATION_HOME_DIR-}"; '
        f"echo two >&2; echo 'tailed 1' >> {log}; sleep 0.3; echo 'tailed 2' >> {log}; sleep 0.3; "
        "echo 'bytes é and a long line'; exit 3"
    )
    argv = ("run", "--stage", "benchmark", "--tail", log, "--", "sh", "-c", stage)
    ran = {}
    for name, start in (("binary", pair.binary), ("pip", pair.pip)):
        instance = f"single-{name}-{uuid.uuid4().hex[:6]}"
        p = start(*argv, instance=instance, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = p.communicate(timeout=120)
        ran[name] = (p.returncode, out, instance, err)
    assert ran["binary"][:2] == ran["pip"][:2] == (3, "one  \nbytes é and a long line\n".encode()), ran
    binary, pip = pair.events(ran["binary"][2]), pair.events(ran["pip"][2])
    assert {type(e).__name__ for e in pip} >= {"Lifecycle", "LogBatch", "ProcessExit", "InstanceFacts"}, pip
    assert _comparable(binary) == _comparable(pip)
    assert pair.leftovers() == [], "the single file left its unpacked folder in /tmp"


def test_the_single_file_spools_and_agent_flush_delivers(pair: Pair) -> None:
    instance = f"single-flush-{uuid.uuid4().hex[:6]}"
    away = pair.binary(
        "event",
        "--stage",
        "boot",
        "--state",
        "info",
        "--detail",
        "while Kafka is away",
        "--no-facts",
        "--flush-timeout",
        "0",
        instance=instance,
        bootstrap="127.0.0.1:1",
        stderr=subprocess.PIPE,
    )
    assert away.wait(60) == 0, away.stderr.read().decode()[-2000:] if away.stderr else ""
    assert pair.events(instance) == []
    flush = pair.binary("flush", instance=instance, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = flush.communicate(timeout=120)
    assert flush.returncode == 0 and b"1 events delivered" in out, (out, err.decode()[-2000:])
    (ev,) = pair.events(instance)
    assert (ev.stage, ev.state, ev.detail) == ("boot", "info", "while Kafka is away")
    manager = pair.binary(
        "manager",
        "event",
        "--instance",
        instance,
        "--kind",
        "destroyed",
        "--spool",
        "/spool",
        instance=instance,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = manager.communicate(timeout=120)
    assert manager.returncode == 0 and b"delivered" in out, (out, err.decode()[-2000:])
    assert sorted(type(e).__name__ for e in pair.events(instance)) == ["Lifecycle", "ManagerEvent"]
    assert pair.leftovers() == []


# A stage that counts the SIGTERMs it gets: it waits half a second after the first for a second copy.
COUNTS_TERM = (
    "n=0; trap 'n=$((n+1))' TERM; : > {ready}; while [ $n -eq 0 ]; do sleep 0.05; done; sleep 0.5; exit $((10+n))"
)


def _agent_pids(loader: int) -> list[int]:
    """The loader and its child, the agent proper (the single file runs as two processes)."""
    kids = Path(f"/proc/{loader}/task/{loader}/children").read_text().split()
    return [loader, *map(int, kids)]


@pytest.mark.parametrize("how", ["kill", "killpg", "pkill"])
def test_the_single_file_passes_a_signal_on_once_as_the_pip_agent_does(pair: Pair, how: str) -> None:
    codes = {}
    for name, start in (("binary", pair.binary), ("pip", pair.pip)):
        ready = f"{pair.work}/ready-{name}"
        p = start(
            "run",
            "--stage",
            "s",
            "--no-facts",
            "--",
            "sh",
            "-c",
            COUNTS_TERM.format(ready=ready),
            instance=f"single-sig-{uuid.uuid4().hex[:6]}",
            bootstrap="127.0.0.1:1",
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        flag = Path(ready) if name == "pip" else pair.root / ready.lstrip("/")
        deadline = time.monotonic() + 60
        while not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert flag.exists(), f"{name}: the stage never started"
        if how == "kill":  # `kill AGENT_PID` (for the single file: the process its caller started)
            os.kill(p.pid, signal.SIGTERM)
        elif how == "killpg":  # the whole group: `kill -- -PGID`, tini -g, a terminal
            os.killpg(p.pid, signal.SIGTERM)
        else:  # `pkill -f flightrec-agent`: every process of the agent at once
            for pid in _agent_pids(p.pid) if name == "binary" else [p.pid]:
                os.kill(pid, signal.SIGTERM)
        p.wait(60)
        codes[name] = p.returncode
    assert codes == {"binary": 11, "pip": 11}, codes  # the stage got exactly one SIGTERM under both
    assert pair.leftovers() == []
