"""docs/operations.md as written: its systemd units verify and run real commands, every flightrec command it shows
parses, every alert has its runbook, the sizing table follows from the measured bytes per line, and the backup and
restore commands run as written against a live materializer."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flightrec.db.snapshot import current

from flightrec.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "operations.md"
UNITS = ROOT / "examples" / "systemd"
RULES = ROOT / "examples" / "prometheus" / "flightrec.rules.yml"
INSTALLED = "/opt/flightrec/venv/bin/flightrec"
EXE = str(Path(sys.executable).with_name("flightrec"))


def _blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)


def _flightrec_commands() -> list[list[str]]:
    """Every `flightrec …` command of the doc's sh blocks and the units' Exec lines, as argument lists."""
    found = []
    for block in _blocks():
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("flightrec "):
                found.append(shlex.split(line)[1:])
    for unit in UNITS.iterdir():
        for line in unit.read_text().splitlines():
            if line.startswith(("ExecStart=", "ExecStop=")) and INSTALLED in line:
                words = shlex.split(line.split("=", 1)[1])
                if words[0] == "/bin/sh":  # sh -c 'exec … flightrec …'
                    words = shlex.split(re.sub(r"\$\([^)]*\)", "DATE", words[-1]))[1:]  # $(date …): a word
                found.append(words[words.index(INSTALLED) + 1 :])
    return found


def test_every_flightrec_command_it_shows_parses() -> None:
    commands = _flightrec_commands()
    assert len(commands) >= 8, commands
    parser = build_parser()
    for args in commands:
        try:
            parser.parse_args(args)
        except SystemExit:
            pytest.fail(
                f"docs/operations.md or a unit shows a command that does not parse: flightrec {shlex.join(args)}"
            )


def test_the_units_verify_with_systemd(tmp_path: Path) -> None:
    verify = shutil.which("systemd-analyze")
    if verify is None:
        pytest.skip("systemd-analyze is not on this machine (systemd is not installed): the units are not verified")
    for unit in UNITS.iterdir():  # the installed path made this checkout's, so the executables exist
        (tmp_path / unit.name).write_text(unit.read_text().replace(INSTALLED, EXE))
    r = subprocess.run(
        [verify, "verify", "--man=no", *map(str, sorted(tmp_path.iterdir()))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and not r.stderr.strip(), r.stdout + r.stderr
    assert {p.name for p in UNITS.iterdir()} >= {
        "flightrec-broker.service",
        "flightrec-materializer.service",
        "flightrec-dashboard.service",
    }


def test_every_alert_has_its_runbook_in_the_guide() -> None:
    text = DOC.read_text()
    alerts = re.findall(r"- alert: (\w+)", RULES.read_text())
    runbooks = re.findall(r"runbook: docs/operations\.md#(\w+)", RULES.read_text())
    assert alerts and [a.lower() for a in alerts] == runbooks
    for alert in alerts:
        assert f"\n### {alert}\n" in text, f"docs/operations.md has no section for {alert}"


def _measured() -> tuple[float, float]:
    text = DOC.read_text()
    db = float(re.search(r"\*\*([\d.]+) bytes per line in the database file\*\*", text).group(1))  # type: ignore[union-attr]  # the doc states both (the test fails here otherwise)
    kafka = float(re.search(r"\*\*([\d.]+) bytes per line in Kafka", text).group(1))  # type: ignore[union-attr]  # the doc states both (the test fails here otherwise)
    return db, kafka


def _gib(text: str) -> float:
    number, unit = text.split()
    return float(number.replace(",", "")) * {"MiB": 1 / 1024, "GiB": 1.0, "TiB": 1024.0}[unit]


def test_the_sizing_table_follows_from_the_measured_bytes_per_line() -> None:
    db, kafka = _measured()
    rows = re.findall(
        r"^\| ([\d,]+) instances \| ([\d,]+) \| ([\d.,]+ [MGT]iB) \| ([\d.,]+ [MGT]iB) \|$", DOC.read_text(), re.M
    )
    assert len(rows) >= 4, rows
    for instances, lines, db_day, kafka_day in rows:
        n = int(instances.replace(",", "")) * int(lines.replace(",", ""))
        assert _gib(db_day) == pytest.approx(n * db / 2**30, rel=0.06), (instances, lines, db_day)
        assert _gib(kafka_day) == pytest.approx(n * kafka / 2**30, rel=0.06), (instances, lines, kafka_day)


@pytest.mark.integration
def test_the_backup_and_restore_commands_run_as_written(kafka, tmp_path: Path) -> None:
    block = next(b for b in _blocks() if b.startswith("flightrec backup --db /srv/flightrec/fleet.duckdb"))
    root = tmp_path / "srv"
    for folder in ("flightrec", "backups", "flightrec-new"):
        (root / folder).mkdir(parents=True)
    db = root / "flightrec" / "fleet.duckdb"
    env = {**kafka.env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONSAFEPATH": "1"}
    kafka.seed_at_mark(db)
    mat = subprocess.Popen(
        [EXE, "materialize", "--db", str(db)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 240  # a loaded machine starts a materializer in seconds to minutes
        while current(db) is None:  # it publishes for readers: it holds the file
            assert time.monotonic() < deadline and mat.poll() is None
            time.sleep(0.2)
        r = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.replace("/srv", str(root))],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        mat.terminate()
        mat.wait(60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "running materializer's snapshot" in r.stdout and "restored" in r.stdout, r.stdout
    assert (root / "flightrec-new" / "fleet.duckdb").exists()
