"""Build the single-file agent `dist/flightrec-agent` with PyInstaller (onefile): `make agent-binary`.

The package is installed (not editable) into build/agent-binary/site first: PyInstaller finds modules on sys.path
and cannot see the editable install's folder mapping. Only the agent's modules go in; the server side is excluded,
so that a stray import of it fails in the tests instead of growing the file. `--if-stale` rebuilds only when a
source is newer than the file (the tests use it: one build per checkout state). Details: docs/agent-binary.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "dist" / "flightrec-agent"
WORK = ROOT / "build" / "agent-binary"
SOURCES = ("src", "producer", "schemas", "pyproject.toml", "scripts/agent_binary.py")
# The server side and what only it imports: never in the agent (see tests/cli/test_profiles.py).
EXCLUDED = (
    "flightrec.db",
    "flightrec.consumers",
    "flightrec.analytics",
    "flightrec.cuda",
    "flightrec.broker",
    "flightrec.catalog",
    "flightrec.demo",
    "duckdb",
    "pyarrow",
    "streamlit",
    "pandas",
    "numpy",
    "altair",
    "pytz",
    "prometheus_client",
    "pycuda",
    # what the agent never imports (each one unpacked costs start-up time at every run)
    "tkinter",
    "setuptools",
    "pkg_resources",
    "_distutils_hack",
    "distutils",
    "readline",
    "pyexpat",
    "xml",
    "multiprocessing",
    "pydoc",
    "_codecs_jp",
    "_codecs_kr",
    "_codecs_cn",
    "_codecs_tw",
    "_codecs_hk",
    "_codecs_iso2022",
    "_multibytecodec",
)


# PyInstaller's spec (its Python): onefile, stripped; what it unpacks at every start is stored, not compressed (21 MB
# instead of 9 MB, but no inflating of 18 MB per run: start-up near the pip agent's; docs/agent-binary.md).
SPEC = """
a = Analysis([{script!r}], pathex=[{site!r}], datas={datas!r}, hiddenimports=["flightrec.producer.late"],
             excludes={excludes!r})
pyz = PYZ(a.pure)
exe = EXE(pyz, a.scripts, a.binaries, a.datas, [], name="flightrec-agent", strip=True, upx=False, console=True,
          cdict={{"EXTENSION": False, "BINARY": False, "DATA": False, "EXECUTABLE": False, "PYZ": False,
                 "SYMLINK": False, "PYSOURCE": True, "PYMODULE": True}})
"""


def newest_source() -> float:
    """The newest modification time among the files the binary is built from."""
    newest = 0.0
    for name in SOURCES:
        path = ROOT / name
        for p in [path] if path.is_file() else path.rglob("*"):
            if p.is_file() and "__pycache__" not in p.parts:
                newest = max(newest, p.stat().st_mtime)
    return newest


def is_stale() -> bool:
    return not OUT.exists() or OUT.stat().st_mtime < newest_source()


def build() -> Path:
    """Install the package into a folder, then freeze `flightrec.cli.standalone` into one file."""
    site = WORK / "site"
    shutil.rmtree(site, ignore_errors=True)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(ROOT),
        ],
        check=True,
        env=env,
    )
    spec = WORK / "flightrec-agent.spec"
    spec.write_text(
        SPEC.format(
            script=str(site / "flightrec" / "cli" / "standalone.py"),
            site=str(site),
            datas=_data(site),
            excludes=list(EXCLUDED),
        )
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "PyInstaller",
            "--noconfirm",
            "--log-level",
            "WARN",
            "--distpath",
            str(OUT.parent),
            "--workpath",
            str(WORK / "work"),
            str(spec),
        ],
        check=True,
        env=env,
        cwd=WORK,
    )
    return OUT


def _data(site: Path) -> list[tuple[str, str]]:
    """The package data the agent reads (importlib.resources): the schemas, current and previous, the secret shapes."""
    pkg = site / "flightrec"
    pairs = [
        (pkg / "schemas" / "previous", "flightrec/schemas/previous"),
        (pkg / "producer" / "secret_shapes.toml", "flightrec/producer"),
    ]
    pairs += [(p, "flightrec/schemas") for p in sorted((pkg / "schemas").glob("*.avsc"))]
    return [(str(src), dest) for src, dest in pairs]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--if-stale", action="store_true", help="build only when a source is newer than the file")
    args = ap.parse_args()
    if args.if_stale and not is_stale():
        print(f"{OUT.relative_to(ROOT)} is newer than its sources: kept")
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    out = build()
    print(f"{out.relative_to(ROOT)}: {out.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
