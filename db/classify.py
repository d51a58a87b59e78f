"""Failure classes: the rule table (rules.toml, data) and the pure classifier over one failure's evidence."""

from __future__ import annotations

import re
import signal as _signal
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from flightrec.errors import ConfigError

_KNOWN_KEYS = {
    "class",
    "hint",
    "lines",
    "signal",
    "exit_codes",
    "timed_out",
    "start_error",
    "verdict",
    "min_proofs_per_hour",
    "stages",
    "deterministic",
}


@dataclass(frozen=True)
class Rule:
    """One row of the rule table; every condition stated must hold (see rules.toml)."""

    failure_class: str
    hint: str
    lines: tuple[re.Pattern[str], ...] = ()
    signals: tuple[str, ...] = ()
    exit_codes: tuple[int, ...] = ()
    timed_out: bool | None = None
    start_error: bool | None = None
    verdict: str | None = None
    min_proofs_per_hour: float | None = None
    stages: tuple[re.Pattern[str], ...] = ()
    deterministic: bool = False  # the class follows from the GPU model or the image: the same offer fails again
    deterministic_for: str | None = None  # what it follows from: gpu_model, driver_version or image (rules.toml)


@dataclass(frozen=True)
class FailureEvidence:
    """What a failed stage left behind, as the classifier sees it."""

    stage: str
    exit_code: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    timed_out: bool = False
    start_error: str | None = None
    stderr_tail: Sequence[str] = ()
    stdout_tail: Sequence[str] = ()
    file_tails: Sequence[tuple[str, Sequence[str]]] = ()
    details: Sequence[str] = ()
    verdict: str | None = None
    proofs_per_hour: float | None = None

    def lines(self) -> Iterator[str]:
        """Evidence lines in the order rules see them: followed files, stderr, stdout, details."""
        for _path, lines in self.file_tails:
            yield from lines
        yield from self.stderr_tail
        yield from self.stdout_tail
        yield from (d for d in self.details if d)


@dataclass(frozen=True)
class Classification:
    """The verdict of the rule table: class, hint, and the line (or field) that matched."""

    failure_class: str
    hint: str
    matched_line: str | None = None


@dataclass(frozen=True)
class RuleTable:
    """An ordered rule table; the first matching rule wins, ``unknown`` when none does."""

    rules: tuple[Rule, ...] = field(default_factory=tuple)
    source: str = ""

    def classify(self, ev: FailureEvidence) -> Classification:
        """Classify one failure. Pure and deterministic: same evidence, same answer."""
        for rule in self.rules:
            matched = _match(rule, ev)
            if matched is not None:
                return Classification(rule.failure_class, rule.hint, matched or None)
        return Classification("unknown", "No rule matched; read the tails and add a rule to db/rules.toml.")


def signal_name(number: int | None, name: str | None = None) -> str | None:
    """The signal's name (SIGKILL) from the event, or derived from its number."""
    if name:
        return name
    if number is None:
        return None
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


_SIGNAL_WORD = re.compile(r"\b(SIG[A-Z]{2,7}[12]?)\b")
_SIGNAL_NUMBER = re.compile(r"\b(?:killed|terminated|died|stopped) (?:by|of|with|on) signal (\d{1,2})\b", re.I)
# A signal's name counts on a line that says a process died of it or got it, and not on one that says a process
# sends, ignores or handles it ("sending SIGTERM to the workers", "received SIGHUP, reloading configuration").
_DEATH_WORDS = re.compile(r"killed|signal|terminated|received|caught|died|dumped|fatal|crash|core", re.I)
_NOT_A_DEATH = re.compile(r"\bsend(?:s|ing)?\b|\bsent\b|ignor|reload|forward|block|handl|install|\btrap|\bmask", re.I)
_HARMLESS = frozenset({"SIGCHLD", "SIGCLD", "SIGWINCH", "SIGURG", "SIGCONT"})  # ignored unless handled
# What a shell or libc prints when a process dies of a signal: anywhere in a line, or (the shell's job report
# "line 3:  4242 Killed  prover") a capitalized word at the start of a line or after a pid.
_SIGNAL_TEXT = [
    (re.compile(r"segmentation fault", re.I), "SIGSEGV"),
    (re.compile(r"\bbus error\b", re.I), "SIGBUS"),
    (re.compile(r"illegal instruction", re.I), "SIGILL"),
    (re.compile(r"floating point exception", re.I), "SIGFPE"),
    (re.compile(r"(?:^|\s\d+\s+)Aborted\b"), "SIGABRT"),
    (re.compile(r"(?:^|\s\d+\s+)Killed\b"), "SIGKILL"),
    (re.compile(r"(?:^|\s\d+\s+)Terminated\b"), "SIGTERM"),
]


def _signal_in(line: str) -> str | None:
    """The signal a line says a process died of, or None."""
    if _NOT_A_DEATH.search(line):
        return None
    number = _SIGNAL_NUMBER.search(line)
    if number:
        try:
            return _signal.Signals(int(number.group(1))).name
        except ValueError:
            pass
    for found in _SIGNAL_WORD.finditer(line):
        name = found.group(1)
        if name in _signal.Signals.__members__ and name not in _HARMLESS and _DEATH_WORDS.search(line):
            return name
    for pattern, name in _SIGNAL_TEXT:
        if pattern.search(line.strip()):
            return name
    return None


def killed_by(
    signal: int | None, name: str | None, exit_code: int | None, lines: Sequence[str]
) -> tuple[str | None, str | None]:
    """The signal behind a failure and where it was read, or (None, None): the stage's own command killed by it,
    a shell's 128+n exit code, or a wrapper's, shell's or libc's words about a process the stage started in
    ``lines`` (give the matched line first, then the tails newest first: the first line that names one wins).
    Pure."""
    if signal:
        return signal_name(signal, name), "the stage's command was killed by it"
    if exit_code is not None and 128 < exit_code < 128 + 65:
        try:
            return _signal.Signals(exit_code - 128).name, f"exit code {exit_code} = 128 + signal number"
        except ValueError:
            pass
    for line in lines:
        found = _signal_in(line)
        if found:
            return found, f"a process the stage started: {line.strip()[:160]}"
    return None, None


def _match(rule: Rule, ev: FailureEvidence) -> str | None:
    """'' or the matched line when the rule holds, None when it does not."""
    found = ""
    if rule.stages and not any(p.search(ev.stage or "") for p in rule.stages):
        return None
    if rule.verdict is not None and ev.verdict != rule.verdict:
        return None
    if rule.min_proofs_per_hour is not None:
        if ev.proofs_per_hour is None or not ev.proofs_per_hour > rule.min_proofs_per_hour:
            return None
        found = f"proofs_per_hour={ev.proofs_per_hour:g}"
    if rule.timed_out is not None and bool(ev.timed_out) != rule.timed_out:
        return None
    if rule.start_error is not None and bool(ev.start_error) != rule.start_error:
        return None
    if rule.exit_codes and ev.exit_code not in rule.exit_codes:
        return None
    if rule.signals:
        name = signal_name(ev.signal, ev.signal_name)
        if name is None or ("any" not in rule.signals and name not in rule.signals):
            return None
        found = found or f"signal {name}"
    if rule.lines:
        for line in ev.lines():
            if any(p.search(line) for p in rule.lines):
                return line
        return None
    if not found:
        if rule.timed_out:
            found = "timed_out"
        elif rule.start_error:
            found = ev.start_error or "start_error"
        elif rule.exit_codes:
            found = f"exit code {ev.exit_code}"
    return found


def _compile(patterns: Any, where: str) -> tuple[re.Pattern[str], ...]:
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError(f"{where}: expected a list of regular expressions")
    try:
        return tuple(re.compile(p, re.IGNORECASE) for p in patterns)
    except re.error as exc:
        raise ConfigError(f"{where}: bad regular expression: {exc}; fix the pattern") from exc


DETERMINISTIC_FOR = ("gpu_model", "driver_version", "image")


def _deterministic(value: Any, where: str) -> str | None:
    """``deterministic = true`` (the GPU model) or the name of what the class follows from; None when false."""
    if value is False:
        return None
    if value is True:
        return "gpu_model"
    if isinstance(value, str) and value in DETERMINISTIC_FOR:
        return value
    raise ConfigError(f"{where}: deterministic must be true, false or one of {list(DETERMINISTIC_FOR)}, not {value!r}")


def deterministic_classes(table: RuleTable) -> dict[str, tuple[str, ...]]:
    """For each of gpu_model, driver_version, image: the classes a rule marks deterministic for it (sorted)."""
    return {
        d: tuple(sorted({r.failure_class for r in table.rules if r.deterministic_for == d})) for d in DETERMINISTIC_FOR
    }


def parse_rules(text: str, source: str = "<rules>") -> RuleTable:
    """Parse a rule table from TOML text; ConfigError names the bad rule."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc
    rules = []
    for i, raw in enumerate(data.get("rule", [])):
        where = f"{source} rule #{i + 1}"
        unknown = set(raw) - _KNOWN_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_KNOWN_KEYS)}")
        if not raw.get("class") or not raw.get("hint"):
            raise ConfigError(f"{where}: every rule needs a class and a hint")
        sigs = raw.get("signal", [])
        det = _deterministic(raw.get("deterministic", False), where)
        rules.append(
            Rule(
                failure_class=str(raw["class"]),
                hint=str(raw["hint"]),
                lines=_compile(raw.get("lines", []), where + " lines"),
                signals=tuple(str(s) for s in ([sigs] if isinstance(sigs, str) else sigs)),
                exit_codes=tuple(int(c) for c in raw.get("exit_codes", [])),
                timed_out=raw.get("timed_out"),
                start_error=raw.get("start_error"),
                verdict=raw.get("verdict"),
                min_proofs_per_hour=raw.get("min_proofs_per_hour"),
                stages=_compile(raw.get("stages", []), where + " stages"),
                deterministic=det is not None,
                deterministic_for=det,
            )
        )
    if not rules:
        raise ConfigError(f"{source} holds no [[rule]] entries")
    return RuleTable(tuple(rules), source)


def load_rules(path: str | Path | None = None) -> RuleTable:
    """The rule table from ``path``, or the packaged db/rules.toml."""
    if path is None:
        text = resources.files("flightrec.db").joinpath("rules.toml").read_text("utf-8")
        return parse_rules(text, "db/rules.toml")
    try:
        return parse_rules(Path(path).read_text("utf-8"), str(path))
    except OSError as exc:
        raise ConfigError(f"cannot read the rule table {path}: {exc}") from exc
