"""Secret shapes: the well-known forms of secrets (secret_shapes.toml), parsed, checked, merged with the operator's."""

from __future__ import annotations

import functools
import logging
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from flightrec.errors import SecretShapesError

log = logging.getLogger(__name__)

BUILTIN = "secret_shapes.toml"  # package data of flightrec.producer
OFF = "off"  # FLIGHTREC_SECRET_SHAPES=off: no shape at all
MIN_NEEDLE = 3
_KEYS = frozenset({"name", "regex", "mask", "needles", "case", "reason", "follow", "follow_mask"})
_CASES = ("insensitive", "sensitive")
_TOP = frozenset({"shape", "disable"})


@dataclass(frozen=True)
class SecretShape:
    """One well-known form of secret: how it is found, which part of it is masked, and why.

    ``mask`` names the regex's groups to mask (empty: the whole match); every text ``regex``
    matches holds one of ``needles`` (ASCII; ``token[=:]``: ``token`` followed by ``=`` or ``:``, see
    :func:`needle_parts`), ignoring ASCII case unless ``case_sensitive`` (then as written: for a regex
    that matches one case only, ``AKIA``, and a cheaper scan where that case is rare). ``follow``, when
    set, is matched at the start of each line after a line whose match ends it, and masks those
    lines (``follow_mask`` as ``mask``) for as long as they match: a private key's body.
    """

    name: str
    regex: re.Pattern[str]
    mask: tuple[str, ...]
    needles: tuple[str, ...]
    reason: str
    case_sensitive: bool = False
    follow: re.Pattern[str] | None = None
    follow_mask: tuple[str, ...] = ()


@dataclass(frozen=True)
class ShapeFile:
    """A parsed file of shapes: its shapes, and the names of built-in shapes it turns off."""

    shapes: tuple[SecretShape, ...]
    disable: tuple[str, ...] = ()
    source: str = ""


def _compile(pattern: Any, where: str, empty: bool = False) -> re.Pattern[str]:
    if not isinstance(pattern, str) or not pattern:
        raise SecretShapesError(f"{where}: expected a regular expression (a non-empty string)")
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise SecretShapesError(
            f"{where}: bad regular expression: {exc}; fix the pattern (Python `re` syntax)"
        ) from exc
    if not empty and rx.fullmatch("") is not None:
        raise SecretShapesError(f"{where}: the regular expression matches an empty text; make it require characters")
    return rx


def _mask(raw: Any, rx: re.Pattern[str], where: str) -> tuple[str, ...]:
    if raw is None or raw == "match":
        return ()
    if not isinstance(raw, list) or not raw or not all(isinstance(g, str) for g in raw):
        raise SecretShapesError(f'{where}: mask must be "match" or a list of the regex\'s named groups')
    for g in raw:
        if g not in rx.groupindex:
            raise SecretShapesError(
                f"{where}: mask names no group named {g!r} in the regex; "
                f"its named groups: {sorted(rx.groupindex) or 'none'}"
            )
    return tuple(raw)


_NEEDLE = re.compile(r"([^\[\]]+)(?:\[([^\[\]]+)\])?")


def needle_parts(needle: str) -> tuple[str, str]:
    """A needle as written (``token`` or ``token[=:]``): its literal, and the characters one of which must follow it
    (empty: any)."""
    m = _NEEDLE.fullmatch(needle)
    return (m.group(1), m.group(2) or "") if m else (needle, "")


def _needles(raw: Any, where: str, sensitive: bool) -> tuple[str, ...]:
    if raw is None:
        raise SecretShapesError(
            f"{where} needs needles: lowercase strings one of which every match holds "
            "(the fast path skips a read that holds none)"
        )
    if not isinstance(raw, list) or not raw or not all(isinstance(n, str) for n in raw):
        raise SecretShapesError(f"{where}: needles must be a list of strings")
    for n in raw:
        if not n.isascii() or (n != n.lower() and not sensitive):
            raise SecretShapesError(
                f"{where}: needle {n!r} must be lowercase ASCII (it is compared with the text's "
                'ASCII letters lowercased; case = "sensitive" compares it as written)'
            )
        if _NEEDLE.fullmatch(n) is None:
            raise SecretShapesError(
                f"{where}: needle {n!r} must be a text, maybe followed by [characters] (one of "
                "which must come next); no other brackets"
            )
        if len(needle_parts(n)[0]) < MIN_NEEDLE:
            raise SecretShapesError(
                f"{where}: needle {n!r} must be at least {MIN_NEEDLE} characters (a shorter one is "
                "in almost every read and would turn the fast path off)"
            )
    return tuple(dict.fromkeys(raw))


def _shape(raw: Any, where: str) -> SecretShape:
    if not isinstance(raw, dict):
        raise SecretShapesError(f"{where}: expected a table ([[shape]])")
    unknown = set(raw) - _KEYS
    if unknown:
        raise SecretShapesError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise SecretShapesError(f"{where} needs a name")
    where = f"{where} ({name})"
    for key in ("regex", "reason"):
        if not raw.get(key):
            raise SecretShapesError(f"{where} needs a {key}")
    if not isinstance(raw["reason"], str):
        raise SecretShapesError(f"{where}: reason must be a string (one line: why this is a secret)")
    rx = _compile(raw["regex"], f"{where} regex")
    case = raw.get("case", "insensitive")
    if case not in _CASES:
        raise SecretShapesError(f'{where}: case must be "insensitive" (the default) or "sensitive", not {case!r}')
    # a follow regex may match an empty line (the blank line inside a PEM block keeps it open)
    follow = _compile(raw["follow"], f"{where} follow", empty=True) if "follow" in raw else None
    return SecretShape(
        name=name,
        regex=rx,
        mask=_mask(raw.get("mask"), rx, where),
        needles=_needles(raw.get("needles"), where, case == "sensitive"),
        reason=raw["reason"],
        case_sensitive=case == "sensitive",
        follow=follow,
        follow_mask=_mask(raw.get("follow_mask"), follow, f"{where} follow") if follow else (),
    )


def parse_shapes(text: str, source: str = "<shapes>") -> ShapeFile:
    """Pure: the shapes in TOML ``text``; SecretShapesError names ``source``, the shape and what to fix."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SecretShapesError(f"{source} is not valid TOML: {exc}") from exc
    unknown = set(data) - _TOP
    if unknown:
        raise SecretShapesError(
            f"{source}: unknown top-level keys {sorted(unknown)}; allowed: [[shape]] tables "
            "and disable = [names of built-in shapes]"
        )
    raw, disable = data.get("shape", []), data.get("disable", [])
    if not isinstance(raw, list) or not isinstance(disable, list) or not all(isinstance(d, str) for d in disable):
        raise SecretShapesError(f"{source}: expected [[shape]] tables and disable = [names]")
    if not raw and not disable:
        raise SecretShapesError(f"{source} holds no [[shape]] entries (and disables none)")
    shapes = tuple(_shape(r, f"{source} shape #{i + 1}") for i, r in enumerate(raw))
    seen: set[str] = set()
    for s in shapes:
        if s.name in seen:
            raise SecretShapesError(f"{source}: the shape {s.name!r} is there twice; give each a name of its own")
        seen.add(s.name)
    return ShapeFile(shapes, tuple(disable), source)


@functools.lru_cache(maxsize=1)
def builtin_shapes() -> tuple[SecretShape, ...]:
    """The list that ships with flightrec (producer/secret_shapes.toml)."""
    text = resources.files("flightrec.producer").joinpath(BUILTIN).read_text("utf-8")
    return parse_shapes(text, f"flightrec/producer/{BUILTIN}").shapes


def merge(base: tuple[SecretShape, ...], extra: ShapeFile) -> tuple[SecretShape, ...]:
    """Pure: ``base`` less the shapes ``extra`` disables, a shape of ``extra`` replacing one of the same name."""
    names = {s.name for s in base}
    for d in extra.disable:
        if d not in names:
            raise SecretShapesError(
                f"{extra.source}: disable names no built-in shape named {d!r}; "
                f"the built-in ones: {', '.join(sorted(names))}"
            )
    mine = {s.name: s for s in extra.shapes}
    out = [mine.pop(s.name, s) for s in base if s.name not in extra.disable]
    return tuple(out) + tuple(mine.values())


def load_shapes(setting: str | None) -> tuple[SecretShape, ...]:
    """The shapes FLIGHTREC_SECRET_SHAPES asks for: unset, the built-in list; ``off``, none; a path, the built-in
    list merged with that file's. SecretShapesError when the file cannot be read or used."""
    if not setting:
        return builtin_shapes()
    if setting.strip().lower() == OFF:
        return ()
    try:
        text = Path(setting).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretShapesError(
            f"cannot read the secret shapes file {setting}: {exc}; point FLIGHTREC_SECRET_SHAPES "
            "at a readable TOML file, or set it to 'off'"
        ) from exc
    shapes = merge(builtin_shapes(), parse_shapes(text, setting))
    log.debug("secret shapes: %s (the built-in list and %s)", ", ".join(s.name for s in shapes), setting)
    return shapes
