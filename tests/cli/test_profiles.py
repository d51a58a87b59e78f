"""Install profiles: the agent's commands import none of the server extra's packages; a command that needs an extra
it lacks says which in one line; the wheel without extras makes a small venv in which the agent works."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

from flightrec.cli import EXTRA_OF_MODULE

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
SERVER = ("duckdb", "pyarrow", "streamlit", "pandas", "numpy", "altair", "pytz")

# Runs `python -m flightrec …` (or flightrec-agent) with the server's packages refused at import: what a
# `pip install flightrec` without extras has.
BLOCKED = r"""
import runpy, sys
BLOCK = set(sys.argv[1].split(","))

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCK:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None

sys.meta_path.insert(0, Refuse())
sys.argv = [sys.argv[2], *sys.argv[3:]]
if sys.argv[0].endswith(".py"):
    runpy.run_path(sys.argv[0], run_name="__main__")
else:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def _blocked(module: str, *args: str, tmp: Path, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        FLIGHTREC_BOOTSTRAP="127.0.0.1:1",  # nothing listens: the agent spools
        FLIGHTREC_SPOOL=str(tmp / "spool"),
        FLIGHTREC_INSTANCE="profile-" + uuid.uuid5(uuid.NAMESPACE_URL, str(tmp)).hex[:8],  # one per test
        FLIGHTREC_FLUSH_TIMEOUT="0",
        FLIGHTREC_FACTS="",
        FLIGHTREC_LOG_LEVEL="CRITICAL",
    )
    p = subprocess.run(
        [sys.executable, "-c", BLOCKED, ",".join(SERVER), module, *args],
        env=env,
        capture_output=True,
        timeout=120,
        cwd=tmp,
    )
    if check_rc is not None:
        assert p.returncode == check_rc, (args, p.stdout.decode()[-2000:], p.stderr.decode()[-3000:])
    return p


AGENT_COMMANDS = [
    ("agent", "run", "--stage", "s", "--tail", "f.log", "--", "sh", "-c", "echo hi; echo tail >> f.log; exit 3"),
    ("agent", "event", "--stage", "s", "--state", "info", "--attr", "k=v"),
    ("agent", "facts", "--force"),
    ("agent", "seal"),
    ("manager", "event", "--instance", "x", "--kind", "rented"),
]


@pytest.mark.parametrize("argv", AGENT_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_the_agent_commands_run_without_the_server_packages(argv: tuple[str, ...], tmp_path: Path) -> None:
    want = 3 if argv[1] == "run" else 0
    p = _blocked("flightrec", *argv, tmp=tmp_path, check_rc=want)
    assert b"blocked by the test" not in p.stderr


@pytest.mark.parametrize("argv", [a[1:] if a[0] == "agent" else a for a in AGENT_COMMANDS], ids=lambda a: a[0])
def test_flightrec_agent_runs_without_the_server_packages(argv: tuple[str, ...], tmp_path: Path) -> None:
    want = 3 if argv[0] == "run" else 0
    p = _blocked("flightrec.cli.standalone", *argv, tmp=tmp_path, check_rc=want)
    assert b"blocked by the test" not in p.stderr


def test_agent_flush_runs_without_the_server_packages(tmp_path: Path) -> None:
    _blocked("flightrec", "agent", "event", "--stage", "s", "--state", "info", tmp=tmp_path)
    p = _blocked("flightrec", "agent", "flush", "--timeout", "1", tmp=tmp_path, check_rc=1)  # nothing listens
    assert b"left in" in p.stdout + p.stderr and b"Traceback" not in p.stderr, p.stderr.decode()[-2000:]


@pytest.mark.parametrize(
    "argv",
    [
        ("materialize", "--db", "x.duckdb"),
        ("sql", "--db", "x.duckdb", "select 1"),
        ("prove", "bench", "--k", "4", "--backend", "cpu"),
    ],
    ids=lambda a: a[0],
)
def test_a_command_of_the_server_extra_says_in_one_line_which_extra_to_install(
    argv: tuple[str, ...], tmp_path: Path
) -> None:
    p = _blocked("flightrec", *argv, tmp=tmp_path, check_rc=1)
    err = p.stderr.decode()
    assert re.fullmatch(
        rf"flightrec {argv[0]}: needs the server extra \(\w+ is not installed\): "
        r"pip install 'flightrec\[server\]'\n",
        err,
    ), err


def norm(requirement: str) -> str:
    """A requirement's distribution name, normalised."""
    return re.split(r"[\s<>=!~;\[(]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_every_module_of_an_extra_names_its_extra() -> None:
    """EXTRA_OF_MODULE (the one-line message) agrees with pyproject's extras and the installed distributions."""
    providers = md.packages_distributions()
    base = {norm(d) for d in PYPROJECT["project"]["dependencies"]}
    for extra in ("server", "gpu"):
        dists = {norm(d) for d in PYPROJECT["project"]["optional-dependencies"][extra]}
        assert not dists & base
        for module, ds in providers.items():
            if {norm(d) for d in ds} & dists and not module.startswith("_"):
                assert EXTRA_OF_MODULE.get(module) == extra, f"{module} (of {ds}) belongs to the {extra} extra"
    assert set(SERVER) <= {m for m, e in EXTRA_OF_MODULE.items() if e == "server"}


@pytest.mark.integration  # builds the wheel and installs it with its dependencies (pip's cache, else PyPI): ~30 s
def test_the_wheel_without_extras_is_a_small_venv_with_a_working_agent(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "wheel"), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "wheel").glob("flightrec-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        capture_output=True,
    )
    assert pip.returncode == 0, pip.stderr.decode()[-3000:]
    env = dict(
        {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
        FLIGHTREC_BOOTSTRAP="127.0.0.1:1",
        FLIGHTREC_SPOOL=str(tmp_path / "spool"),
        FLIGHTREC_INSTANCE="fresh-venv",
        FLIGHTREC_FLUSH_TIMEOUT="0",
        FLIGHTREC_LOG_LEVEL="CRITICAL",
    )
    run = subprocess.run(
        [str(venv / "bin/flightrec"), "agent", "run", "--stage", "s", "--", "sh", "-c", "echo hello; exit 3"],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert (run.returncode, run.stdout) == (3, b"hello\n"), run.stderr.decode()[-2000:]
    assert list((tmp_path / "spool" / "fresh-venv").glob("*.seg")), "the agent spooled nothing"
    same = subprocess.run(
        [str(venv / "bin/flightrec-agent"), "run", "--stage", "s", "--", "true"], env=env, capture_output=True
    )
    assert same.returncode == 0, same.stderr.decode()[-2000:]
    mat = subprocess.run([str(venv / "bin/flightrec"), "materialize"], env=env, capture_output=True, timeout=120)
    assert mat.returncode == 1 and mat.stderr.decode().splitlines() == [
        "flightrec materialize: needs the server extra (duckdb is not installed): pip install 'flightrec[server]'"
    ], mat.stderr.decode()[-2000:]
    installed = {
        d.metadata["Name"].lower()
        for d in md.distributions(path=[str(p) for p in venv.glob("lib/python*/site-packages")])
    }
    assert not installed & {"duckdb", "pyarrow", "streamlit", "pandas", "numpy"}, installed
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    print(f"fresh venv with `pip install flightrec`: {size / 1e6:.1f} MB")
    assert size < 60e6, f"the venv holds {size / 1e6:.1f} MB"


def test_the_agents_log_encoder_needs_no_numpy(tmp_path: Path) -> None:
    """A batch with more than 1024 distinct read times takes the encoder's many-values path, which used numpy."""
    from flightrec.schemas.fastlog import varints

    values = [1_700_000_000_000_000 + 37 * i for i in range(3000)] + [-5, 0, 2**62]
    script = tmp_path / "encode.py"
    script.write_text(
        f"import sys\nfrom flightrec.schemas.fastlog import varints\nsys.stdout.write(varints({values!r}).hex())\n"
    )
    p = _blocked(str(script), tmp=tmp_path)
    assert p.stdout.decode() == varints(values).hex()
