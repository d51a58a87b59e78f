"""The pure failure builder: one failed stage's events become one `failures` row, classified.

Guarantees: deterministic and independent of the order events arrived in (inputs
are sorted by seq here); returns None when the stage shows no failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flightrec.db.classify import FailureEvidence, RuleTable, killed_by, signal_name
from flightrec.db.decisive import decisive_line
from flightrec.db.kinds import failure_kind

PRECEDING_EVENTS = 20  # lifecycle events kept in preceding_events
TAIL_LINES = 20  # lines per source when tails come from log_lines (no ProcessExit)

Row = Mapping[str, Any]


def exit_failed(x: Row) -> bool:
    """A process exit that is a failure: non-zero code, a signal, a start error or a timeout."""
    return bool(
        (x.get("exit_code") not in (None, 0))
        or x.get("signal") is not None
        or x.get("start_error")
        or x.get("timed_out")
    )


# A failed lifecycle event carrying this attribute only reports that another stage
# failed (an entrypoint stopping because its benchmark failed): not a failure of its own.
CONSEQUENCE_ATTR = "failed_stage"


def is_failure_signal(kind: str, row: Row) -> bool:
    """Whether one event (by its kind and row) reveals a failure of its stage."""
    if kind == "lifecycle":
        return row.get("state") == "failed" and CONSEQUENCE_ATTR not in dict(row.get("attributes") or {})
    if kind == "exit":
        return exit_failed(row)
    if kind == "result":
        return row.get("verdict") in ("fail", "error")
    return False


def _order(r: Row) -> tuple[int, str]:
    return (int(r.get("seq") or 0), str(r.get("event_id") or ""))


def _tails(
    exit_row: Row | None, log_tails: Mapping[str, Sequence[str]], late_tails: Mapping[str, Sequence[str]] | None
) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """stderr, stdout and file tails: the exit's (extended by late lines), else the stored log lines'."""
    if exit_row is None:
        file_tails: list[dict[str, Any]] = [
            {"path": src, "lines": list(lines), "exists": True}
            for src, lines in sorted(log_tails.items())
            if src not in ("stderr", "stdout")
        ]
        return list(log_tails.get("stderr", ())), list(log_tails.get("stdout", ())), file_tails
    stderr, stdout = list(exit_row.get("stderr_tail") or ()), list(exit_row.get("stdout_tail") or ())
    file_tails = [
        {"path": t["path"], "lines": list(t.get("lines") or ()), "exists": bool(t.get("exists"))}
        for t in (exit_row.get("file_tails") or ())
    ]
    if late_tails:
        stderr += list(late_tails.get("stderr", ()))
        stdout += list(late_tails.get("stdout", ()))
        by_path = {t["path"]: t for t in file_tails}
        for src, lines in sorted(late_tails.items()):
            if src in ("stderr", "stdout"):
                continue
            if src in by_path:
                by_path[src]["lines"] += list(lines)
            else:
                file_tails.append({"path": src, "lines": list(lines), "exists": True})
    return stderr, stdout, file_tails


def _preceding(lifecycle: Sequence[Row], last_seq: int) -> list[str]:
    """The last PRECEDING_EVENTS lifecycle events up to the last revealing one, as 'stage state detail'."""
    preceding = [
        " ".join(p for p in (r.get("stage") or "", r.get("state") or "", r.get("detail") or "") if p)
        for r in lifecycle
        if int(r["seq"]) <= last_seq and r.get("kind", "lifecycle") == "lifecycle"
    ]
    return preceding[-PRECEDING_EVENTS:]


def _evidence(
    stage: str,
    exit_row: Row | None,
    result: Row | None,
    failed_life: Sequence[Row],
    stderr: list[str],
    stdout: list[str],
    file_tails: list[dict[str, Any]],
) -> FailureEvidence:
    """What the rule table judges: the deciding exit, the last result, the failed lifecycle details, the tails."""
    return FailureEvidence(
        stage=stage,
        exit_code=exit_row.get("exit_code") if exit_row else None,
        signal=exit_row.get("signal") if exit_row else None,
        signal_name=exit_row.get("signal_name") if exit_row else None,
        timed_out=bool(exit_row.get("timed_out")) if exit_row else False,
        start_error=exit_row.get("start_error") if exit_row else None,
        stderr_tail=stderr,
        stdout_tail=stdout,
        file_tails=[(t["path"], t["lines"]) for t in file_tails],
        details=[r.get("detail") or "" for r in failed_life] + ([result.get("detail") or ""] if result else []),
        verdict=result.get("verdict") if result else None,
        proofs_per_hour=result.get("proofs_per_hour") if result else None,
    )


def build_failure(
    instance_id: str,
    boot_id: str,
    stage: str,
    *,
    lifecycle: Sequence[Row],
    exits: Sequence[Row],
    results: Sequence[Row],
    facts: Row | None,
    log_tails: Mapping[str, Sequence[str]],
    rules: RuleTable,
    late_tails: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any] | None:
    """The failures row for (instance, boot, stage), or None when nothing failed.

    ``lifecycle`` holds the boot's lifecycle events (any stage), ``exits`` and
    ``results`` those of this stage, ``facts`` the GPU facts, ``log_tails``
    the last lines per source (used when no ProcessExit carries tails), ``late_tails``
    the last late lines per source (written after the stage's command exited, by what it
    left behind): they extend the exit's tails, so a daemon's decisive last words count.
    """
    lifecycle = sorted(lifecycle, key=_order)
    exits = sorted(exits, key=_order)
    results = sorted(results, key=_order)
    failed_life = [
        r
        for r in lifecycle
        if r.get("stage") == stage and r.get("kind", "lifecycle") == "lifecycle" and is_failure_signal("lifecycle", r)
    ]
    failed_exits = [r for r in exits if exit_failed(r)]
    revealing = sorted(failed_life + failed_exits + [r for r in results if is_failure_signal("result", r)], key=_order)
    if not revealing:
        return None
    exit_row = failed_exits[-1] if failed_exits else exits[-1] if exits else None
    result = results[-1] if results else None
    stderr, stdout, file_tails = _tails(exit_row, log_tails, late_tails)
    evidence = _evidence(stage, exit_row, result, failed_life, stderr, stdout, file_tails)
    verdict = rules.classify(evidence)
    decisive = decisive_line(evidence, verdict)
    signal, read_from = killed_by(
        evidence.signal,
        evidence.signal_name,
        evidence.exit_code,
        ([verdict.rule_line] if verdict.rule_line else [])
        + stderr[::-1]
        + [line for t in file_tails for line in t["lines"][::-1]],
    )
    first, facts = revealing[0], facts or {}
    row = {
        "failure_id": first["event_id"],
        "instance_id": instance_id,
        "boot_id": boot_id,
        "stage": stage,
        "ts_us": int(first["ts_us"]),
        "exit_code": evidence.exit_code,
        "signal": evidence.signal,
        "signal_name": signal_name(evidence.signal, evidence.signal_name),
        "start_error": evidence.start_error,
        "detail": failed_life[-1].get("detail") if failed_life else (result.get("detail") if result else None),
        "stderr_tail": stderr,
        "stdout_tail": stdout,
        "file_tails": file_tails,
        "preceding_events": _preceding(lifecycle, max(int(r["seq"]) for r in revealing)),
        "gpu_model": facts.get("gpu_model"),
        "compute_capability": facts.get("compute_capability"),
        "driver_version": facts.get("driver_version"),
        "cuda_version": facts.get("cuda_version"),
        "proofs_per_hour": result.get("proofs_per_hour") if result else None,
        "min_rate": result.get("min_rate") if result else None,
        "failure_class": verdict.failure_class,
        "hint": verdict.hint,
        "matched_line": decisive.line,  # the old name of decisive_line, kept for SQL written before it
        "killed_by": signal,
        "killed_by_evidence": read_from,
        "decisive_line": decisive.line,
        "decisive_source": decisive.source,
        "decisive_line_no": decisive.line_no,
        "rule_id": verdict.rule_id,
        "rules_version": verdict.rules_version,
    }
    row["kind"], row["kind_template"] = failure_kind(row, timed_out=evidence.timed_out)
    return row
