"""Names that become paths (instance ids, manager sources): quoted so that no value can leave its folder."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import quote

MAX_NAME = 200  # bytes of a quoted name kept as it is; a longer one keeps its start and a hash of the whole


def safe_name(value: str) -> str:
    """``value`` as one file name that stays inside its folder (pure).

    Quoted (``/`` and every byte but letters, digits and ``-_.@~`` as ``%XX``), so no name holds a
    separator; ``.``, ``..`` and the empty name have their dots (or nothing) spelled ``%2E`` (``%00``),
    so no name is the folder itself or its parent; a quoted name over MAX_NAME bytes keeps its
    start and a hash of the whole (file systems refuse names over 255 bytes). Names from earlier
    versions (quoted the same way) are unchanged. ``unquote`` gives the value back, but for a
    hashed name.
    """
    name = quote(value, safe="-_.@")
    if name in ("", ".", ".."):
        return name.replace(".", "%2E") or "%00"
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:16]
        cut = name[: MAX_NAME - 18]
        pct = cut.find("%", len(cut) - 2)  # never cut inside a %XX escape
        name = (cut[:pct] if pct != -1 else cut) + "~" + digest
    return name


def instance_dir(root: str | Path, instance_id: str) -> Path:
    """The folder of one instance inside a spool root (:func:`safe_name` of the id: it never leaves the root)."""
    return Path(root) / safe_name(instance_id)
