"""Settings: every setting is documented, env beats defaults, flags beat env, bad values say what to do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flightrec.errors import ConfigError
from flightrec.settings import SETTINGS, Settings

ROOT = Path(__file__).resolve().parent.parent


def test_every_setting_is_documented():
    doc = (ROOT / "docs" / "settings.md").read_text()
    for s in SETTINGS:
        assert f"`{s.env}`" in doc, f"{s.env} is missing from docs/settings.md"


def test_the_settings_page_is_made_from_the_definitions():
    from flightrec.settings import markdown

    assert (ROOT / "docs" / "settings.md").read_text() == markdown(), "run `make docs`"


def test_each_setting_is_defined_once_as_a_field():
    import dataclasses

    fields = dataclasses.fields(Settings)
    assert [f.metadata["setting"] for f in fields] == list(SETTINGS)
    assert len({s.env for s in SETTINGS}) == len(SETTINGS)
    assert all(s.help for s in SETTINGS)


def test_every_setting_is_read_from_its_variable():
    import dataclasses

    for f in dataclasses.fields(Settings):
        kind = str(f.type).replace(" | None", "")
        special = {
            "security_protocol": ("SASL_SSL", "SASL_SSL"),
            "unauthenticated": ("Refuse", "refuse"),
            "max_message_bytes": ("4096", 4096),  # bounded: at least MIN_LIMIT
            "max_line": ("4096", 4096),  # bounded: at least 16
        }
        raw = {"int": "7", "float": "2.5", "tuple[str, ...]": "A, B"}.get(kind, "debug")
        raw = special.get(f.name, (raw,))[0]
        value = getattr(Settings.from_env({f.metadata["setting"].env: raw}), f.name)
        want = {"int": 7, "float": 2.5, "tuple[str, ...]": ("A", "B")}.get(
            kind, "DEBUG" if f.name == "log_level" else "debug"
        )
        assert value == (special[f.name][1] if f.name in special else want), f.name


def test_every_env_var_the_code_reads_is_a_declared_setting():
    declared = {s.env for s in SETTINGS}
    used: set[str] = set()
    for folder in ("src", "schemas", "producer", "db", "consumers", "analytics", "cuda", "broker", "catalog"):
        for path in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r"[\"'](FLIGHTREC_[A-Z_]+)[\"']", path.read_text()))
    from flightrec.producer.tokens import TOKEN_ENV

    used.discard(TOKEN_ENV)  # not read: the mark `agent run` sets in CMD's environment (docs/agent.md)
    assert used <= declared, f"read but not declared in SETTINGS: {sorted(used - declared)}"


def test_env_then_defaults():
    s = Settings.from_env(
        {
            "FLIGHTREC_BOOTSTRAP": "k1:9093,k2:9093",
            "FLIGHTREC_PARTITIONS": "12",
            "FLIGHTREC_REDACT": "API_KEY, TOKEN",
            "FLIGHTREC_DB": "",
        }
    )
    assert s.bootstrap == "k1:9093,k2:9093"
    assert s.partitions == 12
    assert s.redact == ("API_KEY", "TOKEN")
    assert s.db == "flightrec.duckdb"  # empty means unset


def test_flags_beat_env():
    s = Settings.from_env({"FLIGHTREC_DB": "a.duckdb"}).with_overrides(db="b.duckdb", bootstrap=None)
    assert s.db == "b.duckdb" and s.bootstrap == "localhost:9092"


def test_bad_values_say_what_to_do():
    with pytest.raises(ConfigError, match="FLIGHTREC_PARTITIONS"):
        Settings.from_env({"FLIGHTREC_PARTITIONS": "six"})
    with pytest.raises(ConfigError, match="SECURITY_PROTOCOL"):
        Settings.from_env({"FLIGHTREC_SECURITY_PROTOCOL": "TLS"})
    with pytest.raises(ConfigError, match="SASL"):
        Settings.from_env({"FLIGHTREC_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}).kafka_kwargs()


def test_sasl_settings_reach_the_kafka_client_arguments():
    kw = Settings.from_env(
        {
            "FLIGHTREC_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "FLIGHTREC_SASL_MECHANISM": "PLAIN",
            "FLIGHTREC_SASL_USERNAME": "u",
            "FLIGHTREC_SASL_PASSWORD": "p",
        }
    ).kafka_kwargs()
    assert kw["sasl_mechanism"] == "PLAIN" and kw["sasl_plain_username"] == "u"
    assert kw["security_protocol"] == "SASL_PLAINTEXT"


def test_the_batch_window_is_a_setting_the_materializer_gets() -> None:
    """FLIGHTREC_COMMIT_INTERVAL: how long a partial batch waits (the knob docs/lake.md sizes a catalog with)."""
    import argparse

    from flightrec.db.location import locate

    from flightrec.cli.materialize import materialize_options

    assert Settings.from_env({}).commit_interval == 0.5
    s = Settings.from_env({"FLIGHTREC_COMMIT_INTERVAL": "2", "FLIGHTREC_DB": "x.duckdb"})
    args = argparse.Namespace(
        group=None, until_idle=None, rules=None, no_serve=True, memory_limit="512MB", lock_wait=1.0,
        metrics_port=None, metrics_address="127.0.0.1", data_path=None,
    )  # fmt: skip
    assert materialize_options(args, s, locate(s.db, None, writing=True), ()).commit_interval == 2.0
    for bad in ("0", "-1", "nan", "inf", "61", "soon"):
        with pytest.raises(ConfigError, match="FLIGHTREC_COMMIT_INTERVAL"):
            Settings.from_env({"FLIGHTREC_COMMIT_INTERVAL": bad})


def test_a_number_out_of_its_bounds_is_refused_or_taken_as_the_default_where_asked() -> None:
    """What the agent's parts would refuse later (a line limit under 16 bytes, a negative wait, NaN) is refused at
    reading; `agent run` reads leniently (cli.run_command): the default, and the message kept."""
    bad = {"FLIGHTREC_MAX_LINE": "0", "FLIGHTREC_SEAL_WAIT": "-1", "FLIGHTREC_HEARTBEAT_S": "nan"}
    for name, raw in bad.items():
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: raw})
    unusable: list[str] = []
    s = Settings.from_env({**bad, "FLIGHTREC_TAIL_LINES": "12"}, unusable=unusable)
    assert (s.max_line, s.seal_wait, s.heartbeat_s, s.tail_lines) == (65536, 10.0, 30.0, 12)
    assert len(unusable) == 3 and all(any(n in u for u in unusable) for n in bad)
