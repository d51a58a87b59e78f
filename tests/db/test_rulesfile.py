"""`flightrec rules propose --save` writes the operator's rules file (db/rulesfile.py): appended to what it
holds, loaded back, never a rule twice, and a file it cannot write is said as such."""

from __future__ import annotations

import pytest
from flightrec.db.classify import load_table
from flightrec.db.propose import propose
from flightrec.db.rulesfile import save

from flightrec.errors import ConfigError


def test_saves_append_and_load_back_and_a_rule_is_not_saved_twice(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text("# the operator's own rules\n")
    first = propose("0123456789abcdef", "zorblax: shard <*> of <path>", "zorblax_shard")
    second = propose("fedcba9876543210", 'zorblax ledger <hex> said "no"', "zorblax_ledger", "a hint\nover two lines")
    save(path, first)
    save(path, second)
    table = load_table(None, path)
    assert [r.rule_id for r in table.rules[:2]] == ["kind-0123456789abcdef", "kind-fedcba9876543210"]
    assert table.rules[1].lines[0].search('ZORBLAX ledger 0x1f said "no"')
    assert path.read_text().startswith("# the operator's own rules\n")
    with pytest.raises(ConfigError, match="holds a rule kind-0123456789abcdef already"):
        save(path, first)
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_a_file_it_cannot_write_or_load_is_refused_and_left_as_it_was(tmp_path):
    rule = propose("0123456789abcdef", "zorblax <*>", "zorblax")
    with pytest.raises(ConfigError, match="cannot write the operator's rules file"):
        save(tmp_path / "no-such-folder" / "rules.toml", rule)
    broken = tmp_path / "rules.toml"
    broken.write_text("[[rule]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        save(broken, rule)
    assert broken.read_text() == "[[rule]\n"
