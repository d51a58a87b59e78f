"""A rule proposed from a failure kind (`flightrec rules propose --kind K`): its pattern, derived from the kind's
template, its backtest over the whole history (one DuckDB statement) and its [[rule]] entry. Pure.

The pattern is the template's literal parts, escaped (a run of white space as any run of it), with each placeholder
as a bounded pattern of what it stood for (db/template.py): a value without a space (``<hex>``, ``<path>``,
``<ip>``, ``<host>``, ...) as 1 to 1000 characters that are no white space; ``<size>`` as up to two such runs
with one space between (``12 MiB``), ``<time>`` as up to six (``2026-12-07 01:02:03``, ``Thu Aug  4 15:29:45 PDT
2005``); ``<quoted>`` as a quoted value; ``<*>`` (a token
that held a digit, or another placeholder: ``:"Too Many Requests"``) as up to 1000 characters that are no white
space or whole quoted values. No part can match a character two ways (no backtracking that grows with a line's
quotes). It uses only what Python's ``re`` (the classifier) and RE2 (DuckDB's ``regexp_matches``, the backtest) read
alike, and is searched case-insensitively in a line's first SCAN_CHARS characters by both. A ``<*>`` that stood for
a token holding a size (``847 Mb/s``) does not match its space: of the loghub samples' and the corpus's 35,000
lines, 3 are not matched by their own template's pattern; the backtest says so (matched inside the kind), and a rule
that matches no failure of its kind is refused.

The backtest counts, over every stored failure and line:

- the failures of the kind, and those of them the rule matches (any evidence line: the decisive line, the tails of
  stderr, stdout and the followed files, the detail);
- the failures outside the kind it matches;
- the healthy lines it matches: lines of stages that did not fail (must be 0);
- the matched failures whose class it would change, and of them those already explained (a class other than
  ``unknown``: must be 0).

It is conservative: it does not leave out the lines a program logged at INFO or below, which the classifier ignores,
so it may count a line the rule would never fire on, never the reverse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from flightrec.db.classify import SCAN_CHARS
from flightrec.db.template import PLACEHOLDERS

UNEXPLAINED = "unknown"  # the class of a failure no rule explains
_QUOTED = r"""\s?(?:"[^"]*"|'[^']*')"""
_TOKEN = r"""(?:[^\s"']|\s?"[^"]*"|\s?'[^']*'){1,1000}"""  # RE2 takes no bound inside a bound: a quoted value has none
_PATTERNS = {
    "*": _TOKEN,
    "time": r"\S{1,64}(?:\s{1,2}\S{1,64}){0,5}",
    "size": r"\S{1,64}(?:\s\S{1,64})?",
    "quoted": _QUOTED,
}
_VALUE = r"\S{1,1000}"
_PLACEHOLDER = re.compile(r"<(" + "|".join(PLACEHOLDERS) + r"|\*)>")
_CUT_PLACEHOLDER = re.compile(r"<[a-z*]*$")  # a template cut at its bound in the middle of a placeholder
_SPECIAL = re.compile(r"([\\.^$|?*+()\[\]{}])")


@dataclass(frozen=True)
class ProposedRule:
    """A rule made from a kind: its id, class, hint and the one pattern over the evidence lines."""

    rule_id: str
    failure_class: str
    hint: str
    pattern: str
    kind: str
    template: str


@dataclass(frozen=True)
class Backtest:
    """What a proposed rule would do to the stored history (see the module's doc)."""

    kind_failures: int = 0
    matched_in_kind: int = 0
    matched_outside_kind: int = 0
    healthy_lines: int = 0
    class_changed: int = 0
    explained_changed: int = 0

    def refusal(self) -> str | None:
        """Why the rule may not be saved, or None."""
        if self.healthy_lines:
            return f"it matches {self.healthy_lines} healthy line(s) (lines of stages that did not fail)"
        if self.explained_changed:
            return f"it would change the class of {self.explained_changed} failure(s) a rule already explains"
        if not self.matched_in_kind:
            return "it matches no failure of its own kind"
        return None


def _escaped(literal: str) -> str:
    """A literal part of a template as a pattern: its special characters escaped, white space as ``\\s+``."""
    return r"\s+".join(_SPECIAL.sub(r"\\\1", part) for part in re.split(r"\s+", literal))


def template_pattern(templated: str) -> str:
    """The pattern of a template (see the module's doc). Pure."""
    templated = _CUT_PLACEHOLDER.sub("", templated.strip()).strip()
    out, at = [], 0
    for found in _PLACEHOLDER.finditer(templated):
        out.append(_escaped(templated[at : found.start()]))
        out.append(_PATTERNS.get(found.group(1), _VALUE))
        at = found.end()
    out.append(_escaped(templated[at:]))
    return "".join(out)


def propose(kind: str, templated: str, failure_class: str | None = None, hint: str | None = None) -> ProposedRule:
    """The rule proposed for a kind: id ``kind-<kind>``, the class and hint given (else ones that name the kind)."""
    return ProposedRule(
        rule_id=f"kind-{kind}",
        failure_class=failure_class or f"kind_{kind[:8]}",
        hint=hint or f"Failure kind {kind} ({templated[:200]}): explained by the operator's rule kind-{kind}.",
        pattern=template_pattern(templated),
        kind=kind,
        template=templated,
    )


def _literal(text: str) -> str:
    """A SQL string literal (standard: a quote doubled, a backslash as itself)."""
    return "'" + text.replace("'", "''") + "'"


def backtest_sql(rule: ProposedRule) -> str:
    """One read-only statement giving the Backtest's fields for ``rule`` (the pattern inlined as a literal: a
    reader's statement takes no parameters inside a lambda)."""
    match = f"regexp_matches(left(x, {SCAN_CHARS}), {_literal(rule.pattern)}, 'i')"
    return f"""
WITH f AS (
    SELECT kind = {_literal(rule.kind)} AS in_kind, failure_class,
           len(list_filter(flatten([coalesce(stderr_tail, []), coalesce(stdout_tail, []),
                                    [coalesce(decisive_line, ''), coalesce(detail, '')],
                                    flatten(list_transform(coalesce(file_tails, []), t -> coalesce(t.lines, [])))]),
                           x -> {match})) > 0 AS hit
    FROM failures),
healthy AS (
    SELECT count(*) AS n FROM (SELECT text AS x FROM log_lines
                               ANTI JOIN failures USING (instance_id, boot_id, stage))
    WHERE {match})
SELECT count(*) FILTER (in_kind) AS kind_failures,
       count(*) FILTER (in_kind AND hit) AS matched_in_kind,
       count(*) FILTER (NOT in_kind AND hit) AS matched_outside_kind,
       (SELECT n FROM healthy) AS healthy_lines,
       count(*) FILTER (hit AND failure_class IS DISTINCT FROM {_literal(rule.failure_class)}) AS class_changed,
       count(*) FILTER (hit AND failure_class IS DISTINCT FROM {_literal(rule.failure_class)}
                        AND failure_class IS DISTINCT FROM '{UNEXPLAINED}') AS explained_changed
FROM f
"""


def _toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, and DEL, which JSON leaves raw, is escaped too."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def rule_entry(rule: ProposedRule) -> str:
    """The rule as a [[rule]] entry of an operator's rules file (the kind and template in a comment above it)."""
    comment = "".join(c if c.isprintable() else "?" for c in " ".join(rule.template.split())[:200])
    return (
        f"\n# kind {rule.kind}: {comment}\n"
        "[[rule]]\n"
        f"id = {_toml_string(rule.rule_id)}\n"
        f"class = {_toml_string(rule.failure_class)}\n"
        f"hint = {_toml_string(rule.hint)}\n"
        f"lines = [{_toml_string(rule.pattern)}]\n"
    )


KIND_SQL = """
SELECT kind, any_value(kind_template ORDER BY ts_us DESC) AS template FROM failures
WHERE kind LIKE {prefix} || '%' GROUP BY kind ORDER BY kind LIMIT 2
"""


def kind_sql(prefix: str) -> str:
    """The kinds whose fingerprint starts with ``prefix`` (at most two: one is the answer, two say it is ambiguous),
    with the latest failure's template."""
    return KIND_SQL.format(prefix=_literal(prefix.replace("%", "").replace("_", "")))
