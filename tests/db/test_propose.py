"""A rule proposed from a kind (db/propose.py) and the operator's rules in front of the packaged table
(db/classify.py): the pattern matches the lines its template came from, in Python's re and in DuckDB alike; the
[[rule]] it writes loads back; the version covers both tables."""

from __future__ import annotations

import re

import duckdb
import pytest
from flightrec.db.classify import (
    FailureEvidence,
    load_rules,
    load_table,
    parse_operator_rules,
    rules_version,
    with_operator_rules,
)
from flightrec.db.propose import Backtest, propose, rule_entry, template_pattern
from flightrec.db.template import template

from flightrec.errors import ConfigError

LINES = [
    "zorblax: shard 17 of /data/run-17/p.bin unreadable at offset 99812",
    "zorblax quorum gone: peer 10.0.3.9:703 answered 5512 frames",
    "zorblax ledger 0x3f2a9bc11 turned away after 412ms",
    "job 4242 wrote 12 MiB to /var/run/x.sock in 3.2s (checksum 9f8e7d6c5b4a3f2e)",
    'device=cuda:1 error="bad (thing)" at 2026-12-07 01:02:03.123Z uuid 123e4567-e89b-12d3-a456-426614174000',
    "a.b*c+d?e[f]{g}|h^i$j\\k worker-17 failed",
    "peer fe80::1 gone; retry in 5 min via https://example.org/a?b=c",
    "built Thu Aug  4 15:29:45 PDT 2005 by node-3.rack.example.com:7109 from LOCAL(0)",
]


@pytest.mark.parametrize("line", LINES)
def test_the_pattern_of_a_template_matches_its_line_in_python_and_in_duckdb(line):
    pattern = template_pattern(template(line))
    assert re.search(pattern, line, re.IGNORECASE), pattern
    assert duckdb.sql("SELECT regexp_matches(?, ?, 'i')", params=[line, pattern]).fetchone()[0], pattern


def test_the_pattern_matches_the_same_shape_with_other_values_and_not_another_message():
    pattern = template_pattern(template(LINES[0]))
    assert re.search(pattern, "ZORBLAX: shard 3 of /x/y unreadable at offset 1", re.I)
    assert not re.search(pattern, "zorblax: shard 3 of /x/y readable at offset 1", re.I)
    assert not re.search(pattern, LINES[1], re.I)


def test_a_template_cut_inside_a_placeholder_still_gives_a_pattern():
    assert template_pattern("disk <pa") == "disk"
    long_line = "x 1 y " * 1000  # its template is cut at TEMPLATE_CHARS
    assert re.compile(template_pattern(template(long_line)), re.I).search(long_line)


def test_the_rule_entry_loads_back_with_odd_characters():
    line = 'zorblax "quoted" back\\slash \x7f del, tab\tand ünï 42 at /a/b'
    rule = propose("0123456789abcdef", template(line), "zorblax", 'hint with "quotes"\nand a newline')
    rules = parse_operator_rules(rule_entry(rule), "ops.toml")
    assert [(r.rule_id, r.failure_class, r.hint) for r in rules] == [
        ("kind-0123456789abcdef", "zorblax", 'hint with "quotes"\nand a newline')
    ]
    assert rules[0].lines[0].pattern == rule.pattern
    assert rules[0].lines[0].search(line)


def test_the_operators_rules_come_first_and_the_version_covers_both():
    base = load_rules()
    text = rule_entry(propose("0123456789abcdef", template(LINES[0]), "zorblax"))
    table = with_operator_rules(base, text, "ops.toml")
    assert table.rules[0].rule_id == "kind-0123456789abcdef"
    assert table.rules[1:] == base.rules
    assert table.version not in (base.version, rules_version(text))
    other_base = base.__class__(base.rules, base.source, "000000000000")
    assert with_operator_rules(other_base, text, "ops.toml").version != table.version
    assert with_operator_rules(base, text + "\n# a comment\n", "ops.toml").version != table.version
    verdict = table.classify(FailureEvidence(stage="params", exit_code=3, stderr_tail=[LINES[0]]))
    assert (verdict.failure_class, verdict.rule_id, verdict.rules_version) == (
        "zorblax",
        "kind-0123456789abcdef",
        table.version,
    )


def test_an_operators_file_without_rules_leaves_the_packaged_table_and_its_version(tmp_path):
    base = load_rules()
    assert with_operator_rules(base, "", "ops.toml") is base
    assert with_operator_rules(base, "# nothing yet\n", "ops.toml") is base
    assert load_table(None, tmp_path / "not-made-yet.toml").version == base.version


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[[rule]\nid = 1", "not valid TOML"),
        ('[[rule]]\nid = "x"\nclass = "c"\nhint = "h"\nlines = ["(unclosed"]\n', "bad regular expression"),
        ('[[rule]]\nid = "unknown"\nclass = "c"\nhint = "h"\nlines = ["x"]\n', "packaged table's too"),
        ('[[rule]]\nid = "x"\nclass = "c"\n', "needs a class and a hint"),
    ],
)
def test_a_bad_operators_file_is_refused_with_what_to_fix(text, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        with_operator_rules(load_rules(), text, "ops.toml")


def test_a_backtest_refuses_healthy_lines_and_explained_failures_first():
    assert Backtest(5, 5, 0, 0, 5, 0).refusal() is None
    assert "2 healthy line" in (Backtest(5, 5, 0, 2, 5, 0).refusal() or "")
    assert "3 failure(s) a rule already explains" in (Backtest(5, 5, 3, 0, 8, 3).refusal() or "")
    assert "no failure of its own kind" in (Backtest(5, 0, 0, 0, 0, 0).refusal() or "")
