"""The error classes: one root, and no flag that nothing reads."""

from __future__ import annotations

import ast
from pathlib import Path

import flightrec.errors as errors

ROOT = Path(__file__).resolve().parents[1]


def _subclasses(cls: type) -> list[type]:
    out = [cls]
    for sub in cls.__subclasses__():
        out += _subclasses(sub)
    return out


def test_no_error_carries_a_retriable_flag_that_nothing_reads() -> None:
    # Retry decisions are made where the failure is met (the materializer's read loop, the
    # agent's deliverer); a class-level flag no caller consults only misleads the reader.
    flagged = [c.__name__ for c in _subclasses(errors.FlightrecError) if hasattr(c, "retriable")]
    assert flagged == []
    assert not hasattr(errors.BrokerError("x"), "retriable")
    setters = []
    for folder in ("src", "producer", "consumers", "schemas", "analytics", "broker", "cuda"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.Attribute) and node.attr == "retriable":
                    setters.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                if isinstance(node, ast.keyword) and node.arg == "retriable":
                    setters.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert setters == []
