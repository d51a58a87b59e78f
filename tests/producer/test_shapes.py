"""The secret-shapes file: what it may hold, what a bad one says, that the list ships, and that no shape is slow."""

from __future__ import annotations

import re
import time
from importlib import resources
from pathlib import Path

import pytest
from flightrec.producer.redact import Redactor
from flightrec.producer.secret_forms import Finder
from flightrec.producer.shapes import SecretShapesError, builtin_shapes, load_shapes, needle_parts, parse_shapes
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from flightrec.errors import ConfigError

GOOD = """[[shape]]
name = "acme-key"
regex = 'ACME-(?P<id>[0-9]{8})'
mask = ["id"]
needles = ["acme-"]
reason = "our own licence keys"
"""


def test_the_built_in_list_ships_as_package_data_and_parses() -> None:
    text = resources.files("flightrec.producer").joinpath("secret_shapes.toml").read_text("utf-8")
    shapes = parse_shapes(text, "secret_shapes.toml").shapes
    assert shapes == builtin_shapes()
    names = [s.name for s in shapes]
    assert len(names) == len(set(names)) >= 9
    assert all(s.reason and s.needles for s in shapes)


def test_a_file_of_shapes_masks_its_group_only() -> None:
    shapes = parse_shapes(GOOD, "x.toml").shapes
    assert Redactor(shapes=shapes).text("key ACME-12345678 ok") == "key ACME-*** ok"


def test_case_sensitive_needles_are_compared_as_written() -> None:
    shapes = parse_shapes(GOOD.replace('["acme-"]', '["ACME-"]\ncase = "sensitive"'), "x.toml").shapes
    r = Redactor(shapes=shapes)
    assert r.text("key ACME-12345678 ok") == "key ACME-*** ok" and r.lines(["ACME-12345678"]) == ["ACME-***"]
    assert r.may_need(b"", b"ACME-1\n") and not r.may_need(b"", b"acme-12345678\n")


def test_a_needle_with_followers_counts_only_where_one_follows() -> None:
    shapes = parse_shapes(GOOD.replace('["acme-"]', '["acme[-_]"]').replace("ACME-", "ACME[-_]"), "x.toml").shapes
    r = Redactor(shapes=shapes)
    assert r.text("ACME_12345678") == "ACME_***"
    assert not r.may_need(b"", b"acme: 12345678 acmes\n") and r.may_need(b"", b"the ACME-1\n")


@pytest.mark.parametrize(
    "text,says",
    [
        ("[[shape]\nname=", "is not valid TOML"),
        ("title = 'x'\n", "unknown top-level keys"),
        ("", "holds no [[shape]]"),
        (GOOD.replace('reason = "our own licence keys"', 'reason = "r"\ncolour = "red"'), "unknown keys"),
        (GOOD.replace('reason = "our own licence keys"\n', ""), "needs a reason"),
        (GOOD.replace('needles = ["acme-"]\n', ""), "needs needles"),
        (GOOD.replace("ACME-(?P<id>[0-9]{8})", "ACME-(?P<id>[0-9]{8}"), "bad regular expression"),
        (GOOD.replace('["acme-"]', '["ACME-"]'), "lowercase"),
        (GOOD.replace('["acme-"]', '["ACME-"]\ncase = "upper"'), 'case must be "insensitive"'),
        (GOOD.replace('["acme-"]', '["ac"]'), "at least 3"),
        (GOOD.replace('["acme-"]', '["ac[-_]"]'), "at least 3"),
        (GOOD.replace('["acme-"]', '["acme[-"]'), "no other brackets"),
        (GOOD.replace('["acme-"]', '"acme-"'), "a list of strings"),
        (GOOD.replace('["id"]', '["nope"]'), "no group named 'nope'"),
        (GOOD.replace('["id"]', '"all"'), 'mask must be "match" or a list'),
        (GOOD.replace("ACME-(?P<id>[0-9]{8})", "(?P<id>x*)"), "matches an empty text"),
        (GOOD + GOOD, "twice"),
        (
            GOOD.replace('reason = "our own licence keys"', 'reason = "r"\nfollow = "(x"'),
            "follow: bad regular expression",
        ),
    ],
)
def test_a_bad_file_says_which_shape_and_what_to_fix(text: str, says: str) -> None:
    with pytest.raises(SecretShapesError, match=re.escape(says)) as info:
        parse_shapes(text, "extra.toml")
    assert isinstance(info.value, ConfigError) and "extra.toml" in str(info.value)


def test_the_setting_adds_replaces_disables_or_turns_off(tmp_path: Path) -> None:
    assert load_shapes(None) == load_shapes("") == builtin_shapes()
    assert load_shapes("off") == load_shapes("OFF") == ()
    extra = tmp_path / "shapes.toml"
    extra.write_text('disable = ["token-assignment"]\n' + GOOD + GOOD.replace("acme-key", "aws-access-key"))
    shapes = load_shapes(str(extra))
    names = [s.name for s in shapes]
    assert "acme-key" in names and "token-assignment" not in names
    assert [s for s in shapes if s.name == "aws-access-key"][0].needles == ("acme-",)  # replaced, not added
    assert len(names) == len(builtin_shapes()) + 1 - 1


def test_an_unreadable_file_or_unknown_disabled_name_says_so(tmp_path: Path) -> None:
    with pytest.raises(SecretShapesError, match="cannot read"):
        load_shapes(str(tmp_path / "missing.toml"))
    extra = tmp_path / "shapes.toml"
    extra.write_text('disable = ["no-such-shape"]\n')
    with pytest.raises(SecretShapesError, match="no built-in shape named 'no-such-shape'"):
        load_shapes(str(extra))


# what the shapes' regexes start with, and what may follow: repeated, or followed by long runs, they make a
# regex that can backtrack do so
KEYWORDS = [
    "password",
    "PASSWORD",
    "secret",
    "client_secret",
    "token",
    "api_key",
    "X-Api-Key",
    "authorization",
    "Authorization: Bearer ",
    "--password ",
    "--a-b-token ",
    "AKIA",
    "ghp_",
    "github_pat_",
    "glpat-",
    "AIza",
    "-----BEGIN RSA PRIVATE KEY-----",
    "https://u:p@h",
    "://",
]
SEPARATORS = ["", "=", ": ", '="', "='", '": "', " ", ":", "\\", "@", "/", "-"]
RUNS = ["a", "A", "0", " ", "-", "_", "=", '"', "\\", "'", "a-", "a ", "aaaaaaa ", "A" * 39 + " ", "\\a", ":"]


def _hostile(needle: str) -> list[str]:
    """64 KiB lines built to make a regex around ``needle`` backtrack: repeats, long runs after it, no ending."""
    n = 64 * 1024
    out = []
    for unit in [needle + s for s in SEPARATORS] + [k + s for k in KEYWORDS for s in SEPARATORS]:
        out += [(unit * n)[:n], unit + "a" * n, ((unit + "a" * 30 + " ") * n)[:n]]
    for r in RUNS:
        body = (r * n)[:n]
        out += [needle + body, needle + "=" + body, needle + ': "' + body, "--" + body + needle, body + needle]
    out.append("-----BEGIN RSA PRIVATE KEY-----" + ("-" * n) + "x")
    out.append("-----BEGIN RSA PRIVATE KEY-----" + ("----E" * n)[:n])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("shape", builtin_shapes(), ids=lambda s: s.name)
def test_no_shape_backtracks_on_a_hostile_64_kib_line(shape) -> None:
    r = Redactor(shapes=(shape,))
    for needle in shape.needles[:2]:
        for line in _hostile(needle_parts(needle)[0]):
            t0 = time.perf_counter()
            r.text(line)
            if shape.follow is not None:
                r.lines(["-----BEGIN RSA PRIVATE KEY-----", line, line])
            took = time.perf_counter() - t0
            assert took < 2.0, f"{shape.name} took {took:.2f}s on {line[:40]!r}... ({len(line)} chars)"


# the regex constructs hypothesis cannot generate from: each replaced by a plain equivalent for the generator
_LOOKAROUND = re.compile(r"\(\?<?[!=][^()]*\)")


@pytest.mark.slow
@pytest.mark.parametrize("shape", builtin_shapes(), ids=lambda s: s.name)
@hsettings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(data=st.data())
def test_every_match_of_a_built_in_shape_holds_one_of_its_needles(shape, data) -> None:
    # the fast path skips a read with no needle: a match without one would leak
    pattern = _LOOKAROUND.sub("", shape.regex.pattern)
    text = data.draw(st.from_regex(pattern, fullmatch=True).filter(lambda t: "\n" not in t and "\r" not in t))
    m = shape.regex.search(text)
    if m is None:
        return
    assert Finder([needle_parts(n) for n in shape.needles])(text if shape.case_sensitive else text.lower()), text
    if not shape.mask or any(m.start(g) >= 0 and m.end(g) > m.start(g) for g in shape.mask):
        assert Redactor(shapes=(shape,)).text(text) != text  # (a key's header alone masks the lines after it)
