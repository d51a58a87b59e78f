"""Write tests/file_seconds.txt, the seconds each test file took, from the JUnit XML of a full run.

`make test` hands the longest files out first (tests/conftest.py orders them by this file), so that on two workers
the last file to finish is a short one. Refresh it after tests were added or moved:

    .venv/bin/pytest -n 2 --dist loadfile --junitxml=build/junit.xml
    .venv/bin/python scripts/test_seconds.py build/junit.xml

A file missing from it runs after the listed ones, in collection order; a stale figure only changes the order."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "file_seconds.txt"
HEADER = "# seconds per test file in a full run (scripts/test_seconds.py writes it; tests/conftest.py reads it)\n"


def file_seconds(junit: Path) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/").split("/test_")
        if len(path) < 2:
            continue
        module = path[0] + "/test_" + path[1].split("/")[0] + ".py"
        seconds[module] += float(case.get("time", "0"))
    return dict(seconds)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: scripts/test_seconds.py JUNIT.xml", file=sys.stderr)
        return 2
    seconds = file_seconds(Path(argv[1]))
    rows = sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))
    OUT.write_text(HEADER + "".join(f"{s:8.1f}  {path}\n" for path, s in rows if s >= 1.0))
    print(f"{OUT}: {sum(1 for _, s in rows if s >= 1.0)} files, {sum(seconds.values()) / 60:.1f} min of tests")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
