"""Unit tests of secret masking."""

from __future__ import annotations

from flightrec.producer.redact import Redactor


def test_env_values_are_masked() -> None:
    r = Redactor(["API_TOKEN", "UNSET"], {"API_TOKEN": "tok-123456", "OTHER": "visible"})
    assert r.text("auth tok-123456 and again tok-123456; visible") == "auth *** and again ***; visible"


def test_longest_value_first() -> None:
    r = Redactor(["A", "B"], {"A": "abcd", "B": "abcdefgh"})
    assert r.text("x abcdefgh y abcd") == "x *** y ***"


def test_short_values_are_not_masked() -> None:
    r = Redactor(["N"], {"N": "1"})
    assert r.text("1 + 1") == "1 + 1"


def test_url_credentials_are_masked() -> None:
    r = Redactor()
    assert r.text("GET https://bob:hunter2@example.com/x ok") == "GET https://***:***@example.com/x ok"
    assert r.text("postgres://u:p@db:5432/x") == "postgres://***:***@db:5432/x"
    # a user alone may be a token (https://TOKEN@host): it is masked too
    assert r.text("ssh://git@github.com/repo and http://example.com/a@b") == "ssh://***@github.com/repo and http://example.com/a@b"


def test_lines_fast_path_returns_same_list() -> None:
    r = Redactor(["T"], {"T": "secret-value"})
    lines = ["a", "b"]
    assert r.lines(lines) is lines
    assert r.lines(["a", "has secret-value", "x://u:p@h"]) == ["a", "has ***", "x://***:***@h"]


def test_mapping() -> None:
    r = Redactor(["T"], {"T": "secret-value"})
    assert r.mapping({"url": "https://a:b@h", "k": "secret-value"}) == {"url": "https://***:***@h", "k": "***"}
