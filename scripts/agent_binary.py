"""Build the single-file agent `dist/flightrec-agent` with PyInstaller (onefile): `make agent-binary`.

The package is installed (not editable) into build/agent-binary/site first: PyInstaller finds modules on sys.path
and cannot see the editable install's folder mapping. Only the agent's modules go in; the server side is excluded,
so that a stray import of it fails in the tests instead of growing the file. `--if-stale` rebuilds only when a
source is newer than the file (the tests use it: one build per checkout state). Details: docs/agent-binary.md.

`--portable` (`make agent-binary`, the file to ship) builds the same inside a Debian 11 root filesystem made with
debootstrap (glibc 2.31, the oldest release Debian's mirror serves), with CPython compiled there from Debian's copy of
its source, profile-guided and link-time optimized: the file then needs glibc 2.30 (Ubuntu 20.04, Debian 11 and later)
and its Python is faster than a default build. The root filesystem and that Python are kept in build/agent-root (~12
minutes the first time on two cores, ~1 minute after). It needs root (chroot, mounts in a private namespace).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "dist" / "flightrec-agent"
WORK = ROOT / "build" / "agent-binary"
SOURCES = ("src", "producer", "schemas", "pyproject.toml", "scripts/agent_binary.py")
# --portable: the root filesystem it is built in, what it holds, and the Python built there (Debian's pool keeps the
# upstream tarball of every Python it packages; the digest is Debian's, from its Sources index).
ROOTFS = ROOT / "build" / "agent-root"
SUITE, MIRROR = "bullseye", "http://deb.debian.org/debian"
ROOT_PACKAGES = ",".join(
    ("gcc", "make", "libc6-dev", "binutils", "patch", "xz-utils", "bzip2", "ca-certificates")
    + ("libssl-dev", "zlib1g-dev", "libffi-dev", "libbz2-dev", "liblzma-dev", "uuid-dev")  # CPython's modules
)
PYTHON_SOURCE = (
    f"{MIRROR}/pool/main/p/python3.11/python3.11_3.11.2.orig.tar.gz",
    "2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849",
)
# Debian 12's fixes to that release (its security updates): the series from FIXES_FROM on; the patches before it fit
# Python to Debian's own layout and are not applied.
PYTHON_FIXES = (
    f"{MIRROR}/pool/main/p/python3.11/python3.11_3.11.2-6+deb12u8.debian.tar.xz",
    "ece2d63c70ac0b7a401fbe6b51b0103be997c294a01a3865549be1862794ba97",
)
FIXES_FROM = "shutdown-deadlock.diff"
# zlib from Debian 12 for the file's zlib module: the spool frames every record with zlib.crc32, which Debian 11's
# zlib 1.2.11 computes several times slower (the share of the agent's CPU in it: BENCHMARKS.md, Single-file agent).
ZLIB_SOURCE = (
    f"{MIRROR}/pool/main/z/zlib/zlib_1.2.13.dfsg.orig.tar.bz2",
    "71feb7947e3c00ef125f83b79a4e529bde31171e5babe48b391f06758d1ab0a1",
)
PYTHON = "/opt/python/bin/python3.11"  # inside the root filesystem
# The agent's dependencies and the freezer, at the versions this checkout's environment has (the same code as the pip
# agent it is measured against).
PINNED = ("aiokafka", "fastavro", "setproctitle", "pyinstaller", "pyinstaller-hooks-contrib", "setuptools", "wheel")
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


def in_root(script: str, what: str) -> None:
    """Run a shell script inside the root filesystem with /proc, /dev and this checkout (at /src) mounted in a private
    mount namespace: the mounts end with the process, however it ends."""
    print(f"--portable: {what}", flush=True)
    mounts = (
        f"mount -t proc proc {ROOTFS}/proc && mount --rbind /dev {ROOTFS}/dev && mkdir -p {ROOTFS}/src"
        f" && mount --bind {ROOT} {ROOTFS}/src"
    )
    inner = f"export HOME=/root PATH=/opt/python/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8; set -e; {script}"
    subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-ec",
            f'{mounts} && chroot {ROOTFS} sh -c "$0"',
            inner,
        ],
        check=True,
    )


def fetch(url: str, digest: str, dest: Path) -> None:
    """Download ``url`` to ``dest`` unless it is there; refuse it unless its SHA-256 is ``digest``."""
    if dest.exists() and hashlib.sha256(dest.read_bytes()).hexdigest() == digest:
        return
    print(f"--portable: {url}", flush=True)
    with urllib.request.urlopen(url, timeout=300) as r:
        data = r.read()
    if hashlib.sha256(data).hexdigest() != digest:
        raise SystemExit(f"agent_binary.py --portable: {url} does not have the digest Debian publishes: not used")
    dest.write_bytes(data)


def make_root() -> None:
    """Debian 11 with a C toolchain and the headers CPython's modules need, then CPython built there (kept)."""
    built = ROOTFS / "opt" / "python" / "BUILT"  # written once CPython is installed: a build cut short is redone
    if not built.exists():
        if os.geteuid() != 0:
            raise SystemExit("agent_binary.py --portable: needs root (debootstrap, chroot); run it as root or in a VM")
        if not shutil.which("debootstrap") and not (ROOTFS / "usr" / "bin" / "gcc").exists():
            raise SystemExit("agent_binary.py --portable: needs debootstrap (apt-get install debootstrap)")
        if not (ROOTFS / "usr" / "bin" / "gcc").exists():
            partial = ROOTFS.with_name(ROOTFS.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            print(f"--portable: debootstrap {SUITE} into {partial.relative_to(ROOT)} (~1 minute)", flush=True)
            subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={ROOT_PACKAGES}", SUITE, str(partial), MIRROR],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            shutil.rmtree(ROOTFS, ignore_errors=True)
            partial.rename(ROOTFS)
        for url, digest in (PYTHON_SOURCE, PYTHON_FIXES, ZLIB_SOURCE):
            fetch(url, digest, ROOTFS / "usr" / "src" / url.rsplit("/", 1)[1])
        in_root(
            f"cd /usr/src && rm -rf zlib-1.2.13.dfsg /opt/zlib && tar -xjf {ZLIB_SOURCE[0].rsplit('/', 1)[1]}"
            " && cd zlib-1.2.13.dfsg && ./configure --prefix=/opt/zlib > configure.log && make -j$(nproc) > make.log"
            " && make install > install.log",
            "zlib 1.2.13",
        )
        in_root(
            f"cd /usr/src && rm -rf Python-3.11.2 debian && tar -xzf {PYTHON_SOURCE[0].rsplit('/', 1)[1]}"
            f" && tar -xJf {PYTHON_FIXES[0].rsplit('/', 1)[1]} && cd Python-3.11.2"
            f" && sed -n '/^{FIXES_FROM}$/,$p' ../debian/patches/series"
            " | while read -r p; do patch -p1 -s --forward < ../debian/patches/$p || exit 1; done"
            " && ./configure --prefix=/opt/python --enable-shared --enable-optimizations --with-lto"
            " CPPFLAGS=-I/opt/zlib/include LDFLAGS='-L/opt/zlib/lib -Wl,-rpath,/opt/python/lib:/opt/zlib/lib'"
            " > configure.log 2>&1"
            # Debian's fix for CVE-2026-4224 calls an internal API in pyexpat, which Debian builds into the core
            " && sed -i 's|^MODULE_PYEXPAT_CFLAGS=.*|& -DPy_BUILD_CORE_MODULE|' Makefile"
            " && make -j$(nproc) > make.log 2>&1 && rm -rf /opt/python && make install > install.log 2>&1"
            " && echo ok > /opt/python/BUILT",
            "CPython 3.11 with PGO and LTO (~12 minutes on two cores; logs in build/agent-root/usr/src/Python-3.11.2)",
        )
    for name in ("resolv.conf", "ssl/certs/ca-certificates.crt", "pip.conf"):  # the host's name service and trust
        if Path("/etc", name).exists():
            shutil.copy(Path("/etc", name), ROOTFS / "etc" / name)
    pins = " ".join(f"{name}=={importlib.metadata.version(name)}" for name in PINNED)
    in_root(f"{PYTHON} -m pip install -q --disable-pip-version-check {pins}", f"pip install {pins}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--if-stale", action="store_true", help="build only when a source is newer than the file")
    ap.add_argument(
        "--portable",
        action="store_true",
        help="build in a Debian 11 root filesystem with an optimized Python (glibc >= 2.30; the file to ship)",
    )
    args = ap.parse_args()
    if args.if_stale and not is_stale():
        print(f"{OUT.relative_to(ROOT)} is newer than its sources: kept")
        return 0
    if args.portable:
        make_root()
        in_root(f"{PYTHON} /src/scripts/agent_binary.py", "freezing the agent with that Python")
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    out = build()
    print(f"{out.relative_to(ROOT)}: {out.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
