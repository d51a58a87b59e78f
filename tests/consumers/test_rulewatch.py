"""The operator's rules file as a running materializer watches it (consumers/rulewatch.py): a change is seen by
the file's stat, a file that does not parse is refused with one log line and the rules in use stay."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from flightrec.consumers.rulewatch import CHECK_S, RulesWatch
from flightrec.db.classify import load_rules

from flightrec.errors import ConfigError

RULE = '[[rule]]\nid = "mine"\nclass = "zorblax"\nhint = "h"\nlines = ["zorblax"]\n'


def _write(path: Path, text: str) -> None:
    """As `rules propose --save` does: a new file renamed over the old one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_a_changed_file_is_taken_up_once_and_a_bad_one_is_refused_with_one_line(tmp_path, caplog):
    base = load_rules()
    path = tmp_path / "rules.toml"
    watch = RulesWatch(base, path)  # not made yet: no operator rule
    assert watch.table is base and watch.reclassifying
    now = 100.0
    _write(path, RULE)
    assert watch.look(now)
    assert watch.table.rules[0].rule_id == "mine" and watch.table.rules[1:] == base.rules
    ours = watch.table
    watch.reclassifying = False
    assert not watch.look(now + 0.1)  # looked at most every CHECK_S
    now += CHECK_S
    assert not watch.look(now)  # unchanged
    _write(path, RULE)  # the same rules in a new file: nothing to do
    now += CHECK_S
    assert not watch.look(now) and not watch.reclassifying
    caplog.set_level(logging.INFO, logger="flightrec.consumers.rulewatch")
    _write(path, RULE + "[[rule]\n")
    for _ in range(3):
        now += CHECK_S
        assert not watch.look(now)
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.ERROR and ours.version in refused[0].getMessage()
    assert watch.table is ours and not watch.reclassifying
    path.unlink()  # the operator's rules taken away: the packaged table alone
    now += CHECK_S
    assert watch.look(now) and watch.table.version == base.version and watch.reclassifying


def test_a_materializer_does_not_start_on_a_file_it_cannot_load(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text('[[rule]]\nid = "unknown"\nclass = "c"\nhint = "h"\nlines = ["x"]\n')
    with pytest.raises(ConfigError, match="packaged table's too"):
        RulesWatch(load_rules(), path)
