"""Whatever a host hands the agent - instance ids, stage names, arguments, environment (the agent's own settings
among it), output bytes - `agent run` runs the command, passes its output through byte for byte and exits with its
status. Generated inputs through the real agent (a subprocess, its spool, no broker: Kafka adds nothing to an exit
status)."""

from __future__ import annotations

import os
import subprocess

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

NO_NUL = st.binary(max_size=40).map(lambda b: os.fsdecode(b.replace(b"\x00", b"")))  # any bytes argv can hold
WAITS = ("FLIGHTREC_FOLLOW_GRACE", "FLIGHTREC_SEAL_WAIT", "FLIGHTREC_LATE_WAIT", "FLIGHTREC_HEARTBEAT_S")
SETTINGS = (
    "FLIGHTREC_REDACT",
    "FLIGHTREC_SECRET_SHAPES",
    "FLIGHTREC_SECURITY_PROTOCOL",
    "FLIGHTREC_SASL_MECHANISM",
    "FLIGHTREC_SASL_USERNAME",
    "FLIGHTREC_SASL_PASSWORD",
    "FLIGHTREC_SASL_PASSWORD_FILE",
    "FLIGHTREC_SSL_CAFILE",
    "FLIGHTREC_INSTANCE_KEY",
    "FLIGHTREC_UNAUTHENTICATED",
    "FLIGHTREC_MAX_MESSAGE_BYTES",
    "FLIGHTREC_MAX_LINE",
    "FLIGHTREC_TAIL_LINES",
    "FLIGHTREC_CLOCK_OFFSET_S",
    "FLIGHTREC_LOG_LEVEL",
)
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["nan", "inf", "-inf", "1e308", "-0", "0x10", " 5 ", "", "abc"]),
)
ENV_VALUE = st.one_of(NO_NUL, NUMBERS).filter(lambda v: "\x00" not in v)
ENV = st.dictionaries(
    st.one_of(st.sampled_from(SETTINGS), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True)),
    ENV_VALUE,
    max_size=6,
)
WAIT_ENV = st.dictionaries(
    st.sampled_from(WAITS), st.one_of(st.floats(-10, 1.0).map(repr), st.sampled_from(["x", "nan", "-inf", ""]))
)


@settings(
    max_examples=24,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# what this test found first: a line limit the batcher refuses, a clock shift that no long can encode
@example(instance="i", stage="s", args=[], env={"FLIGHTREC_MAX_LINE": "0"}, waits={}, output=b"", code=0)
@example(
    instance="L7", stage="", args=[], env={"FLIGHTREC_CLOCK_OFFSET_S": "9221575457767"}, waits={}, output=b"x", code=3
)
@example(
    instance="-i",
    stage="--s",
    args=["--", "-x"],
    env={"FLIGHTREC_HEARTBEAT_S": "abc"},
    waits={"FLIGHTREC_SEAL_WAIT": "-1"},
    output=b"\xff\n",
    code=255,
)
@given(
    instance=NO_NUL,
    stage=NO_NUL,
    args=st.lists(NO_NUL, max_size=5),
    env=ENV,
    waits=WAIT_ENV,
    output=st.binary(max_size=3000),
    code=st.integers(0, 255),
)
def test_the_command_always_runs_and_keeps_its_exit_status(
    spool_env, tmp_path_factory, instance, stage, args, env, waits, output, code
) -> None:
    out = tmp_path_factory.mktemp("out") / "bytes"
    out.write_bytes(output)
    base = spool_env.env()
    base.pop("FLIGHTREC_INSTANCE")
    given_env = {k: v for k, v in {**env, **waits}.items() if k not in base}
    argv = [
        *spool_env.argv("run", f"--instance={instance}", f"--stage={stage}"),
        "--",
        "sh",
        "-c",
        'cat "$1"; exit "$2"',
        "sh",
        str(out),
        str(code),
        *args,
    ]
    r = subprocess.run(argv, env={**base, **given_env}, capture_output=True, timeout=120)
    assert r.returncode == code, (given_env, r.stderr[-3000:])
    assert r.stdout == output, (given_env, r.stderr[-3000:])
    assert b"Traceback" not in r.stderr, r.stderr[-3000:]
