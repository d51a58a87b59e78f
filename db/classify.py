"""Failure classes: the rule table (rules.toml, data) and the pure classifier over one failure's evidence."""

from __future__ import annotations

import hashlib
import re
import signal as _signal
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from flightrec.db.loglevel import quiet

from flightrec.errors import ConfigError

_KNOWN_KEYS = {
    "id",
    "symptom",
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


# Rules (and the decisive line's weighing) read a line's first SCAN_CHARS characters: a cause is said at a line's
# start, and a line of 64 KiB (the longest the agent ships) costs no more than this.
SCAN_CHARS = 8192
RATE_FIELD = "proofs_per_hour"  # what a rule on the benchmark's rate matched: `proofs_per_hour=12.5`


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
    deterministic_for: str | None = None  # what it follows from: gpu_model, driver_version, image or host
    rule_id: str = ""  # its name in the table (rules.toml's `id`; else the class and its place in the file)
    symptom: bool = False  # its lines are what a crash prints after its cause: they do not choose the decisive line


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
        for located in self.located():
            yield located.text

    def located(self) -> Iterator[Located]:
        """The evidence lines with where each stands (its source and its place in that source's tail), in the
        order rules see them: followed files, stderr, stdout, details (empty details left out)."""
        for path, lines in self.file_tails:
            yield from (Located(path, n, text) for n, text in enumerate(lines))
        yield from (Located("stderr", n, text) for n, text in enumerate(self.stderr_tail))
        yield from (Located("stdout", n, text) for n, text in enumerate(self.stdout_tail))
        yield from (Located("detail", n, text) for n, text in enumerate(self.details) if text)


@dataclass(frozen=True)
class Located:
    """One evidence line and where it stands: its source (stderr, stdout, a followed file's path, detail: the
    stage's failed lifecycle events and benchmark result) and its 0-based place in that source's tail."""

    source: str
    line_no: int
    text: str


@dataclass(frozen=True)
class Classification:
    """The verdict of the rule table: class and hint, the rule that gave them (its id and the table's version),
    the first line the rule matched (or the field: ``signal SIGKILL``, ``timed_out``) and every line it matched."""

    failure_class: str
    hint: str
    rule_line: str | None = None
    rule_id: str | None = None  # None: no rule matched
    rules_version: str = ""
    matched: tuple[Located, ...] = ()
    symptom: bool = False  # the rule is a generic symptom's (rules.toml's `symptom`)


@dataclass(frozen=True)
class RuleTable:
    """An ordered rule table; the first matching rule wins, ``unknown`` when none does."""

    rules: tuple[Rule, ...] = field(default_factory=tuple)
    source: str = ""
    version: str = ""  # the table's text named by its digest: which rules classed a failure

    def classify(self, ev: FailureEvidence) -> Classification:
        """Classify one failure. Pure and deterministic: same evidence, same answer. Lines the program itself logged
        at INFO, NOTICE, DEBUG or TRACE (db/loglevel.py) are no evidence of a class: a healthy program says
        "connection refused, retrying" or "CUDA cannot serve, proving on the CPU" at that level."""
        located = evidence_lines(ev)
        for rule in self.rules:
            matched = _match(rule, ev, located)
            if matched is not None:
                found, lines = matched
                return Classification(
                    rule.failure_class,
                    rule.hint,
                    found or None,
                    rule.rule_id,
                    self.version,
                    lines if rule.symptom else self._named(rule.failure_class, ev, located),
                    rule.symptom,
                )
        return Classification(
            "unknown", "No rule matched; read the tails and add a rule to db/rules.toml.", rules_version=self.version
        )

    def _named(self, failure_class: str, ev: FailureEvidence, located: Sequence[Located]) -> tuple[Located, ...]:
        """Every line that a rule of this class naming a cause (no symptom) matches and that holds here, in the
        order rules see them: where the decisive line is chosen (a download's summary and the curl error above it)."""
        found: set[tuple[str, int]] = set()
        for rule in self.rules:
            if rule.failure_class == failure_class and not rule.symptom and rule.lines:
                matched = _match(rule, ev, located)
                found.update((at.source, at.line_no) for at in (matched[1] if matched else ()))
        return tuple(at for at in located if (at.source, at.line_no) in found)


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


# How the agent's failed event repeats the stage's last stderr line (producer/run.py): the line is judged by its own
# level, not by the summary's.
LAST_STDERR = "; last stderr line: "


def evidence_lines(ev: FailureEvidence) -> tuple[Located, ...]:
    """The lines rules judge: every evidence line but those logged at a level that says they are no failure."""
    return tuple(at for at in ev.located() if not _quiet(at))


def matched_lines(rule: Rule, located: Sequence[Located]) -> tuple[Located, ...]:
    """The lines of ``located`` that one of the rule's patterns matches (in a line's first SCAN_CHARS characters)."""
    return tuple(at for at in located if any(p.search(at.text, 0, SCAN_CHARS) for p in rule.lines))


def _quiet(at: Located) -> bool:
    """Whether a line is logged at a level that says it is no failure (INFO, NOTICE, DEBUG, TRACE)."""
    text = at.text[:SCAN_CHARS]
    if at.source == "detail" and LAST_STDERR in text:
        text = text.split(LAST_STDERR, 1)[1]
    return quiet(text)


def exit_signal(ev: FailureEvidence) -> str | None:
    """The signal a failure's exit says: the one that killed the stage's command, or a shell's 128 + N."""
    name = signal_name(ev.signal, ev.signal_name)
    if name is None and ev.exit_code is not None and 128 < ev.exit_code < 128 + 65:
        try:
            name = _signal.Signals(ev.exit_code - 128).name
        except ValueError:
            return None
    return name


def _fields_hold(rule: Rule, ev: FailureEvidence) -> bool:
    """Whether every condition of the rule on the exit, the result and the stage holds (lines aside)."""
    if rule.stages and not any(p.search(ev.stage or "") for p in rule.stages):
        return False
    if rule.verdict is not None and ev.verdict != rule.verdict:
        return False
    if rule.min_proofs_per_hour is not None and not (
        ev.proofs_per_hour is not None and ev.proofs_per_hour > rule.min_proofs_per_hour
    ):
        return False
    if rule.timed_out is not None and bool(ev.timed_out) != rule.timed_out:
        return False
    if rule.start_error is not None and bool(ev.start_error) != rule.start_error:
        return False
    if rule.exit_codes and ev.exit_code not in rule.exit_codes:
        return False
    if rule.signals:
        name = exit_signal(ev)
        return name is not None and ("any" in rule.signals or name in rule.signals)
    return True


def _field_found(rule: Rule, ev: FailureEvidence) -> str:
    """What a rule without lines matched: the measured rate, the signal, the timeout, the start error, the code."""
    if rule.min_proofs_per_hour is not None:
        return f"{RATE_FIELD}={ev.proofs_per_hour:g}"
    if rule.signals:
        return f"signal {exit_signal(ev)}"
    if rule.timed_out:
        return "timed_out"
    if rule.start_error:
        return ev.start_error or "start_error"
    if rule.exit_codes:
        return f"exit code {ev.exit_code}"
    return ""


def _match(rule: Rule, ev: FailureEvidence, located: Sequence[Located]) -> tuple[str, tuple[Located, ...]] | None:
    """None when the rule does not hold; else what it matched first (a line, or a field: '' for none) and every
    line it matched."""
    if not _fields_hold(rule, ev):
        return None
    if rule.lines:
        lines = matched_lines(rule, located)
        return (lines[0].text, lines) if lines else None
    return _field_found(rule, ev), ()


def _compile(patterns: Any, where: str) -> tuple[re.Pattern[str], ...]:
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise ConfigError(f"{where}: expected a list of regular expressions")
    try:
        return tuple(re.compile(p, re.IGNORECASE) for p in patterns)
    except re.error as exc:
        raise ConfigError(f"{where}: bad regular expression: {exc}; fix the pattern") from exc


DETERMINISTIC_FOR = ("gpu_model", "driver_version", "image", "host")


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
    """For each of gpu_model, driver_version, image, host: the classes a rule marks deterministic for it (sorted)."""
    return {
        d: tuple(sorted({r.failure_class for r in table.rules if r.deterministic_for == d})) for d in DETERMINISTIC_FOR
    }


def parse_rules(text: str, source: str = "<rules>") -> RuleTable:
    """Parse a rule table from TOML text; ConfigError names the bad rule."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc
    rules = [_rule(raw, i, f"{source} rule #{i + 1}") for i, raw in enumerate(data.get("rule", []))]
    if not rules:
        raise ConfigError(f"{source} holds no [[rule]] entries")
    ids = [r.rule_id for r in rules]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    if twice:
        raise ConfigError(f"{source}: rule ids used twice: {twice}; give each rule its own id")
    return RuleTable(tuple(rules), source, rules_version(text))


def rules_version(text: str) -> str:
    """A rule table's version: the first 12 hex digits of the SHA-256 of its text (the same text, the same
    version, on every machine)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def _rule(raw: dict[str, Any], i: int, where: str) -> Rule:
    """One [[rule]] of the table, checked."""
    unknown = set(raw) - _KNOWN_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_KNOWN_KEYS)}")
    if not raw.get("class") or not raw.get("hint"):
        raise ConfigError(f"{where}: every rule needs a class and a hint")
    sigs = raw.get("signal", [])
    det = _deterministic(raw.get("deterministic", False), where)
    return Rule(
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
        rule_id=str(raw.get("id") or f"{raw['class']}-{i + 1}"),
        symptom=bool(raw.get("symptom", False)),
    )


def load_rules(path: str | Path | None = None) -> RuleTable:
    """The rule table from ``path``, or the packaged db/rules.toml."""
    if path is None:
        text = resources.files("flightrec.db").joinpath("rules.toml").read_text("utf-8")
        return parse_rules(text, "db/rules.toml")
    try:
        return parse_rules(Path(path).read_text("utf-8"), str(path))
    except OSError as exc:
        raise ConfigError(f"cannot read the rule table {path}: {exc}") from exc


def parse_operator_rules(text: str, source: str) -> tuple[Rule, ...]:
    """The rules of an operator's own rules file (FLIGHTREC_RULES_FILE): the same [[rule]] entries as rules.toml, and
    none at all is allowed (a file made before its first rule). ConfigError names the bad rule."""
    if not text.strip():
        return ()
    try:
        if not tomllib.loads(text).get("rule"):
            return ()
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from exc
    return parse_rules(text, source).rules


def with_operator_rules(base: RuleTable, text: str, source: str) -> RuleTable:
    """``base`` with the operator's rules (``text``, from ``source``) in front of its own. Its version covers both:
    the base's when the operator's file holds no rule, else the digest of the two versions. An id used in both is
    refused (``failures.rule_id`` names one rule)."""
    rules = parse_operator_rules(text, source)
    if not rules:
        return base
    clash = sorted({r.rule_id for r in rules} & {r.rule_id for r in base.rules})
    if clash:
        raise ConfigError(f"{source}: rule ids {clash} are the packaged table's too; give the operator's rules own ids")
    version = rules_version(f"{rules_version(text)}+{base.version}")
    return RuleTable(rules + base.rules, f"{source} + {base.source}", version)


def read_operator_rules(path: str | Path) -> str:
    """The text of an operator's rules file; a file not made yet holds no rule (empty text)."""
    try:
        return Path(path).read_text("utf-8")
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the operator's rules file {path}: {exc}") from exc


def load_table(base: str | Path | None = None, operator: str | Path | None = None) -> RuleTable:
    """The rule table a materializer classes with: the operator's rules (FLIGHTREC_RULES_FILE) in front of ``base``
    (``--rules FILE``, else the packaged db/rules.toml)."""
    table = load_rules(base)
    if not operator:
        return table
    return with_operator_rules(table, read_operator_rules(operator), str(operator))
