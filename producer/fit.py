"""Fit events into Kafka's message limit before they are spooled: cut argv and share the tails' byte budget."""

from __future__ import annotations

import dataclasses
from typing import Any

from flightrec.schemas import FileTail, ProcessExit

from flightrec.producer.lines import cut_text, fit_tails

ARG_BYTES = 4096  # one argv element, at most
ARGV_BYTES = 64 * 1024  # all of argv, at most; the elements after that are counted in a last element
MARGIN = 4096  # room for the envelope, field tags and length prefixes


def fit_argv(argv: list[str]) -> list[str]:
    """``argv`` with each element cut to ARG_BYTES bytes and ARGV_BYTES in all (the cut is said). Pure."""
    out: list[str] = []
    total = 0
    for i, a in enumerate(argv):
        a = cut_text(a, ARG_BYTES)
        total += len(a.encode("utf-8", "surrogatepass"))
        if total > ARGV_BYTES:
            out.append(f"[cut: {len(argv) - i} more arguments]")
            break
        out.append(a)
    return out


def fit_exit(fields: dict[str, Any], limit: int) -> dict[str, Any]:
    """ProcessExit fields whose argv and tails together stay under ``limit`` bytes once encoded. Pure.

    The tails (stdout, stderr, each followed file) share what is left after the other fields; each
    keeps its newest lines, and one that lost lines says so in its first line.
    """
    out = dict(fields)
    argv = fit_argv([str(a) for a in out.get("argv", ())])
    out["argv"] = argv
    files = [f if isinstance(f, FileTail) else FileTail(**f) for f in out.get("file_tails", ())]
    other = sum(len(a.encode("utf-8", "surrogatepass")) + 4 for a in argv)
    other += sum(len(f.path.encode("utf-8", "surrogatepass")) + 8 for f in files)
    other += sum(len(str(out.get(k) or "").encode("utf-8", "surrogatepass")) for k in ("stage", "start_error"))
    budget = max(0, limit - other - MARGIN)
    tails = [list(out.get("stdout_tail", ())), list(out.get("stderr_tail", ()))] + [list(f.lines) for f in files]
    fitted = fit_tails(tails, budget)
    out["stdout_tail"], out["stderr_tail"] = fitted[0], fitted[1]
    out["file_tails"] = [FileTail(path=f.path, lines=lines, exists=f.exists) for f, lines in zip(files, fitted[2:])]
    return out


def fit_exit_event(ev: ProcessExit, limit: int) -> ProcessExit:
    """``ev`` with argv and tails cut as :func:`fit_exit` does (applied after masking, so no secret is cut). Pure."""
    out = fit_exit({"argv": list(ev.argv), "stage": ev.stage, "start_error": ev.start_error,
                    "stdout_tail": list(ev.stdout_tail), "stderr_tail": list(ev.stderr_tail),
                    "file_tails": list(ev.file_tails)}, limit)
    return dataclasses.replace(ev, argv=out["argv"], stdout_tail=out["stdout_tail"], stderr_tail=out["stderr_tail"],
                               file_tails=out["file_tails"])
