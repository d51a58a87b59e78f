"""The spool folder has one owner: no module outside the spool's code joins a path to it or opens, locks or removes a
file of it (static checks, as the layering tests are); the folder's names are the ones the agent has always used, and
its operations do what they promise."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

from flightrec.producer import spoolfolder
from flightrec.producer.spoolfolder import SpoolFolder

ROOT = Path(__file__).resolve().parent.parent.parent
PARTS = ("schemas", "producer", "db", "consumers", "analytics", "cuda", "broker", "catalog", "src/flightrec")
# the spool's code: the spool itself and the module that names every file of its folder
OWNERS = {ROOT / "producer" / "spool.py", ROOT / "producer" / "spoolfolder.py"}

# an expression that is (or builds) an instance's spool folder
FOLDER = re.compile(r"\bspool_dir\b|\bspool\.dir\b|\binstance_dir\(|\bfiles\.path\b|\bfolder\.path\b|^self\.dir$")
# the names (and name prefixes) of the files in a spool folder
NAMES = re.compile(
    r"^(lock|cursor|reserve|ended|deliver\.lock|delivery-away|late\.(lock|log|pid))$|"
    r"^(late-|member-|follow-claim-|seal-request-|once-|\.late-lost-|\.taken-|cursor\.)|\.seg$"
)
CONSTANTS = {"LOCK", "MEMBER", "CLAIM", "LATE_STAGE", "LEFT", "LOST", "REQUEST", "PREFIX", "AWAY", "ENDED", "LOG"}
JOINS = {"glob", "rglob", "iterdir", "joinpath", "with_name"}


def _names_a_spool_file(node: ast.expr) -> bool:
    """``"late.pid"``, ``f"member-{boot}"``, ``f"{LOST}{boot}"``: a literal or prefix naming a spool folder's file."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(NAMES.search(node.value))
    if isinstance(node, ast.Name):
        return node.id in CONSTANTS
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.FormattedValue):
            return _names_a_spool_file(first.value)
        return _names_a_spool_file(first)
    return False


def _is_folder(node: ast.expr) -> bool:
    return bool(FOLDER.search(ast.unparse(node)))


def joins(source: str) -> list[tuple[int, str]]:
    """(line, code) of every path joined to a spool folder in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            hit = _is_folder(node.left) or _names_a_spool_file(node.right)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in JOINS:
            hit = _is_folder(node.func.value) or any(_names_a_spool_file(a) for a in node.args)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.path.join", "Path", "pathlib.Path"):
            hit = len(node.args) > 1 and any(_is_folder(a) or _names_a_spool_file(a) for a in node.args)
        elif isinstance(node, ast.JoinedStr):  # f"{spool.dir}/cursor"
            parts = node.values
            hit = any(
                isinstance(v, ast.FormattedValue)
                and _is_folder(v.value)
                and isinstance(w, ast.Constant)
                and str(w.value).startswith("/")
                for v, w in zip(parts, parts[1:], strict=False)
            )
        if hit:
            out.append((node.lineno, ast.unparse(node)))
    return out


def outside_the_spool(check: Callable[[str], list[tuple[int, str]]]) -> list[str]:
    """``path:line: code`` of every finding of ``check`` in the parts' sources outside the spool's code."""
    return [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for part in PARTS
        for path in sorted((ROOT / part).rglob("*.py"))
        if path not in OWNERS
        for line, code in check(path.read_text())
    ]


def test_no_module_outside_the_spool_joins_a_path_to_its_folder() -> None:
    bad = outside_the_spool(joins)
    assert not bad, "paths joined to the spool folder outside producer/spoolfolder.py (ask SpoolFolder):\n" + "\n".join(
        bad
    )


def test_the_check_finds_each_kind_of_join() -> None:
    found = joins(
        "p = spool_dir / 'late.pid'\n"
        "q = agent.spool.dir / f'late-{token}'\n"
        "r = list(self.spool.dir.glob(f'{LOST}*'))\n"
        "s = x / f'member-{boot}-{pid}'\n"
        "t = instance_dir(root, i) / ENDED\n"
        "u = os.path.join(spool_dir, 'cursor')\n"
        "v = p / 'lock'\n"
        "w = Path(agent.spool.dir, 'cursor')\n"
        "x = open(f'{spool_dir}/late.pid')\n"
    )
    assert sorted({line for line, _code in found}) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert not joins("home = Path(settings.home) / 'demo'\nout = Path(tmp) / 'prove.cubin'\n")


def test_the_files_keep_their_names(tmp_path: Path) -> None:
    """The names are the on-disk contract with agents of earlier versions on the same machine."""
    f = SpoolFolder(tmp_path)
    assert f.lock.name == "lock" and f.cursor.name == "cursor" and f.reserve.name == "reserve"
    assert f.segment(7).name == "000000000007.seg" and f.once("b", "facts").name == "once-b-facts"
    assert f.deliver_lock.name == "deliver.lock" and f.delivery_away.name == "delivery-away"
    assert f.late_lock.name == "late.lock" and f.late_pid.name == "late.pid" and f.late_log.name == "late.log"
    assert f.late_stage("t").name == "late-t" and f.late_left("b", "t").name == "late-left-b-t"
    assert f.seal_request("b").name == "seal-request-b" and f.ended.name == "ended"
    assert f.new_member("b").name.startswith("member-b-") and f.follow_claim("b", "/x").name.startswith(
        "follow-claim-b-"
    )
    tmp, note = f.new_late_lost("b", 3)
    assert tmp.name.startswith(".late-lost-b-") and note.name == tmp.name[1:]
    for p in (f.late_stage("t"), f.late_left("b", "t"), note):
        p.write_text("")
    assert ("t", f.late_stage("t")) in f.late_stages() and all(p != f.late_left("b", "t") for _t, p in f.late_stages())
    assert f.late_losts("b") == [note] and f.late_lefts("b") == [f.late_left("b", "t")]
    assert spoolfolder.segment_name(12) == "000000000012.seg"


# SpoolFolder's members that give the path of one file of the folder: only the spool's code opens, locks or removes
# a file through them; every other part asks for an operation (hold_member, write_claim, late_locked, ...)
FILE_PATHS = {
    name
    for name, member in vars(SpoolFolder).items()
    if not name.startswith("_")
    and (
        ret := getattr(
            getattr(member, "fget", None) or getattr(member, "__func__", None) or member, "__annotations__", {}
        ).get("return")
    )
    in ("Path", "tuple[Path, Path]")
}
HOLDER = re.compile(r"(\bfiles|\bfolder|SpoolFolder(\.of\(.*\)|\(.*\))?)$")


def file_paths_used(source: str) -> list[tuple[int, str]]:
    """(line, code) of every use of a spool file's path (SpoolFolder's FILE_PATHS members) in ``source``."""
    return [
        (node.lineno, ast.unparse(node))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in FILE_PATHS and HOLDER.search(ast.unparse(node.value))
    ]


def test_no_module_outside_the_spool_opens_locks_or_removes_a_file_of_its_folder() -> None:
    assert {"late_pid", "delivery_away", "new_member", "follow_claim", "late_stage", "ended", "late_lock"} <= FILE_PATHS
    bad = outside_the_spool(file_paths_used)
    assert not bad, (
        "a spool file's path used outside the spool's code (add an operation to SpoolFolder):\n" + "\n".join(bad)
    )
    found = file_paths_used(
        "a = folder.late_pid.read_text()\nb = self.spool.files.ended\nc = SpoolFolder.of(r, i).delivery_away\n"
        "d = x.lock\n"
    )
    assert sorted(line for line, _ in found) == [1, 2, 3]


def test_the_operations_keep_what_they_promise(tmp_path: Path) -> None:
    """Members are held while their fd lives and their dead files cleaned; claims, registrations, notes and markers
    are written whole and taken once."""
    import os

    f = SpoolFolder(tmp_path)
    path, fd = f.hold_member("b", {"what": "stage x", "pid": 1})
    dead = f.new_member("b")
    dead.write_text("{}")  # a member whose process died without leaving: nobody holds it
    assert f.live_members("b") == [{"what": "stage x", "pid": 1}] and not dead.exists()
    assert f.live_members("other") == [] and f.live_members("b", exclude=path) == []
    f.drop_member(path, fd)
    assert not path.exists() and f.live_members("b") == []
    f.write_claim("b", "/var/log/x", "one")
    f.write_claim("b", "/var/log/x", "two")
    assert f.read_claim("b", "/var/log/x") == "two" and len(list(tmp_path.glob("follow-claim-*"))) == 1
    f.register_late_stage("t1", "b 12 bench")
    assert f.late_registrations() == [("t1", "b 12 bench")]
    f.unregister_late_stage("t1")
    assert f.late_registrations() == []
    f.note_late_left("b", "t1", "stage bench (pid 9)")
    assert f.take_late_lefts("b") == ["stage bench (pid 9)"] and f.take_late_lefts("b") == []
    f.write_late_lost("b", 1, "{}")
    f.write_late_lost("old", 2, "{}")
    taken = f.take_late_losts("b")
    assert [t for _p, t in taken] == ["{}"] and f.take_late_losts("b") == []
    assert [p.name for p in f.late_lost_boots_but("b")] == [f"late-lost-old-{os.getpid()}-2"]
    f.request_seal("b", "1 2.5")
    assert f.seal_requested("b") and f.seal_request_text("b") == "1 2.5"
    f.end_seal_request("b")
    assert not f.seal_requested("b") and f.seal_request_text("b") is None
    assert f.read_late_pid() == 0
    f.write_late_pid(42)
    assert f.read_late_pid() == 42
    f.clear_late_pid()
    assert f.read_late_pid() == 0
    held = f.try_lock_delivery()
    assert held is not None and f.try_lock_delivery() is None  # one sender per folder (flock: per open file)
    f.note_delivery_away("first\n")
    f.note_delivery_away("second\n")
    assert f.delivery_away_noted() and f.delivery_away.read_text() == "first\n"
    f.clear_delivery_away()
    assert not f.delivery_away_noted()
    f.release_delivery(held)
    again = f.try_lock_delivery()
    assert again is not None
    f.release_delivery(again)
    f.mark_ended(True)
    assert f.is_ended()
    f.mark_ended(False)
    assert not f.is_ended()
