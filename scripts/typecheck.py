"""Type-check the package with mypy as it is installed: the folders mapped onto one tree of links (build/typecheck)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    mapping: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    tree = ROOT / "build" / "typecheck"
    top = tree / "flightrec"
    top.mkdir(parents=True, exist_ok=True)
    for package, folder in sorted(mapping.items()):  # mypy cannot read setuptools' package-dir: links can
        parts = package.split(".")[1:]
        if not parts:
            for path in (ROOT / folder).glob("*.py"):
                _link(top / path.name, path)
        elif len(parts) == 1:  # a nested one (flightrec.schemas.previous) comes with its parent's link
            _link(top / parts[0], ROOT / folder)
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "-p", "flightrec"]
    return subprocess.run(cmd, cwd=tree).returncode


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() and Path(os.readlink(link)) == target:
        return
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


if __name__ == "__main__":
    sys.exit(main())
