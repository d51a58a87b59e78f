"""Secrets never leave: every string field of every event is masked before it is spooled (read the spool's bytes)."""

from __future__ import annotations

import string
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from flightrec.producer.agent import SyncAgent
from flightrec.producer.redact import Redactor
from flightrec.producer.batcher import SourceBatcher
from flightrec.producer.run import run_stage
from flightrec.schemas import FileTail, Lifecycle, ProcessExit
from flightrec.settings import Settings

PY = sys.executable
PEM = ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
       "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
       "QyNTUxOQAAACD7xQz9YV1mNq3W8kF6sPnR2aJtLhGcX0uE5iBvTdYyOwAAAJgAAAAAAAAA\n"
       "-----END OPENSSH PRIVATE KEY-----")


def _agent(tmp: Path, env: dict[str, str], **kw: object) -> SyncAgent:
    s = Settings(instance="sec-test", spool=str(tmp / "spool"), redact=tuple(env), **kw)  # type: ignore[arg-type]
    return SyncAgent(settings=s, deliver=False, env=env)


def _spooled(tmp: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((tmp / "spool").rglob("*")) if p.is_file())


def _assert_absent(secret: str, data: bytes) -> None:
    assert secret.encode() not in data
    for line in secret.splitlines():
        if len(line.strip()) >= 4:
            assert line.strip().encode() not in data, line


def test_every_field_is_masked(tmp_path: Path) -> None:
    secret = "s3cr3t-VALUE-9f8e"
    a = _agent(tmp_path, {"TOK": secret})
    with a:
        a.event("st", "info", detail=f"d {secret}", attributes={f"k-{secret}": f"v {secret}"})
        a.emit(ProcessExit, stage="st", argv=["x", secret], exit_code=127, start_error=f"{secret}: not found",
               started_us=1, ended_us=2, duration_s=0.0, stdout_tail=[secret], stderr_tail=[f"e {secret}"],
               file_tails=[FileTail(path=f"/p/{secret}", lines=[secret], exists=False)])
        a.seal(f"ended with {secret}")
    _assert_absent(secret, _spooled(tmp_path))


def test_argv_with_a_quote_is_masked_before_joining(tmp_path: Path) -> None:
    secret = "it's-a-secret-42"
    a = _agent(tmp_path, {"TOK": secret})
    with a:
        run_stage(a, "q", ["true", f"--token={secret}"], passthrough=False)
    data = _spooled(tmp_path)
    _assert_absent(secret, data)
    assert b"-a-secret-42" not in data  # not even the part after the quote shlex.join splits off


def test_a_multi_line_secret_is_masked_line_by_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KEY", PEM)  # the command prints it from its environment
    a = _agent(tmp_path, {"KEY": PEM})
    with a:
        run_stage(a, "pem", ["sh", "-c", 'printf "%s\\n" "$KEY"; printf "%s\\n" "$KEY" >&2'], passthrough=False)
    data = _spooled(tmp_path)
    _assert_absent(PEM, data)
    assert b"b3BlbnNz" not in data and data.count(b"***") >= 8


def test_a_cut_line_does_not_leak_the_start_of_a_secret(tmp_path: Path) -> None:
    secret = "ABCDEFGHIJKLMNOP"
    a = _agent(tmp_path, {"TOK": secret}, max_line=64)
    with a:
        b = SourceBatcher(a, "cut", "stdout", 1, max_line=64, tail_lines=5)
        b.feed(b"x" * 58 + secret.encode() + b" and more\n")  # the cut at 64 bytes falls inside the secret
        b.close()
    data = _spooled(tmp_path)
    assert b"ABCDEF" not in data and b"xxxxxx" in data


def test_url_credentials_of_every_shape() -> None:
    r = Redactor()
    assert r.text("redis://:pw-123@cache:6379/0") == "redis://***:***@cache:6379/0"
    assert r.text("git clone https://ghp_TOKEN123@github.com/x.git") == "git clone https://***@github.com/x.git"
    assert r.text("https://user:p@ss@word@host/x ok") == "https://***:***@host/x ok"
    assert "hunter2" not in r.text("GET https://bob:hunter2@example.com/x")
    assert r.text("http://example.com/a@b") == "http://example.com/a@b"


SECRET_CHARS = string.ascii_uppercase + string.digits + "'\"@:/!$%&()*+,;=?[]{}|~^ \\"
secrets = st.one_of(
    st.text(SECRET_CHARS, min_size=8, max_size=40).filter(lambda s: sum(c.isalpha() for c in s) >= 4),
    st.lists(st.text(string.ascii_uppercase + string.digits + "+/=", min_size=8, max_size=30),
             min_size=2, max_size=4).map("\n".join),
)
filler = st.text(string.ascii_lowercase + " .-", max_size=20)
FIELDS = ("detail", "attr_key", "attr_value", "argv", "start_error", "stdout_tail", "file_path", "seal", "line",
          "url_password")


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=secrets, where=st.sampled_from(FIELDS), pre=filler, post=filler, max_line=st.integers(16, 80))
def test_no_generated_secret_reaches_the_spool(tmp_path_factory, secret: str, where: str, pre: str, post: str,
                                               max_line: int) -> None:
    tmp = tmp_path_factory.mktemp("prop")
    env = {"TOK": secret}
    text = f"{pre}{secret}{post}"
    if where == "url_password":  # a password in a URL needs no FLIGHTREC_REDACT at all
        secret = secret.replace("\n", "").replace(" ", "").replace("/", "").replace("\\", "")
        if sum(c.isalpha() for c in secret) < 4:
            return
        env = {}
        text = f"{pre} https://user:{secret}@host/path {post}"
    a = _agent(tmp, env, max_line=max_line)
    with a:
        if where in ("detail", "attr_key", "attr_value", "url_password"):
            attrs = {text: "v"} if where == "attr_key" else {"k": text} if where == "attr_value" else {}
            a.emit(Lifecycle, stage="s", state="info", detail=text if where in ("detail", "url_password") else "",
                   attributes=attrs)
        elif where in ("argv", "start_error", "stdout_tail", "file_path"):
            a.emit(ProcessExit, stage="s", argv=["cmd", text] if where == "argv" else ["cmd"],
                   start_error=text if where == "start_error" else None, started_us=1, ended_us=2, duration_s=0.0,
                   stdout_tail=[text] if where == "stdout_tail" else [],
                   file_tails=[FileTail(path=text, lines=[], exists=False)] if where == "file_path" else [])
        elif where == "seal":
            a.seal(text)
        else:
            b = SourceBatcher(a, "s", "stdout", 1, max_line=max_line, tail_lines=3)
            b.feed(text.encode() + b"\n")
            b.close()
    data = _spooled(tmp)
    _assert_absent(secret, data)
    if where == "line" and "\n" not in secret:  # a line cut inside the secret: not even its start leaks
        assert secret[:6].encode() not in data
