"""The avoid-list's rule on a table of counts: the pure function, and the SQL of the avoid_list view agreeing with
it."""

from __future__ import annotations

import duckdb
import pytest
from flightrec.db.avoid import AVOID_RATE, MIN_INSTANCES, because_sql, judge, wilson, wilson_sql
from flightrec.db.classify import deterministic_classes, load_rules, parse_rules

from flightrec.errors import ConfigError

# (instances, failed, failed with a class deterministic for this dimension) -> banned, because
TABLE = [
    ((1, 1, 0), False, "too_few"),  # one flaky failure (cuda_out_of_memory) bans nothing
    ((1, 1, 1), True, "deterministic"),  # one gpu_arch_unsupported bans the GPU model
    ((60, 30, 0), True, "rate"),  # 30 of 60: the rate is at least 37 % with 95 % confidence
    ((60, 2, 0), False, "rate_may_be_low"),  # 2 of 60: it may well be 1 %
    ((4, 4, 0), False, "too_few"),  # 4 of 4 flaky: fewer rentals than MIN_INSTANCES
    ((5, 5, 0), True, "rate"),
    ((5, 3, 0), False, "rate_may_be_low"),  # 3 of 5: the interval's low end is 23 %
    ((200, 40, 0), False, "rate_may_be_low"),  # 20 % is below the ban however sure
    ((200, 70, 0), True, "rate"),
    ((3, 0, 0), False, "no_failure"),
]


@pytest.mark.parametrize(("counts", "banned", "because"), TABLE, ids=[f"{c[1]}of{c[0]}-det{c[2]}" for c, *_ in TABLE])
def test_the_rule_bans_on_a_deterministic_class_or_a_confident_rate(counts, banned, because):
    v = judge(*counts)
    assert (v.banned, v.because) == (banned, because), v
    assert 0.0 <= v.rate_low <= counts[1] / counts[0] <= v.rate_high <= 1.0


def test_the_wilson_interval_has_its_textbook_values():
    # Wilson score interval, z = 1.96: 30 of 60 -> 0.3773..0.6227; 1 of 1 -> 0.2065..1; 0 of 10 -> 0..0.2775
    assert wilson(30, 60) == pytest.approx((0.37733, 0.62267), abs=1e-4)
    assert wilson(1, 1) == pytest.approx((0.20654, 1.0), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)
    assert (AVOID_RATE, MIN_INSTANCES) == (0.25, 5)


def test_the_views_sql_gives_the_same_verdict_as_the_function():
    """avoid_list runs wilson_sql and because_sql: the same numbers and reasons on every count up to 80."""
    rows = [(n, k, d) for n in range(0, 81) for k in range(0, n + 1) for d in (0, min(1, k))]
    con = duckdb.connect()
    con.execute("CREATE TABLE t (n INTEGER, k INTEGER, d INTEGER)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    got = con.execute(
        f"SELECT n, k, d, {wilson_sql('k', 'n', -1)} AS lo, {wilson_sql('k', 'n', 1)} AS hi, "
        f"{because_sql('n', 'k', 'd', wilson_sql('k', 'n', -1))} FROM t ORDER BY n, k, d"
    ).fetchall()
    assert len(got) == len(rows)
    for n, k, d, lo, hi, because in got:
        v = judge(n, k, d)
        assert (lo, hi) == pytest.approx((v.rate_low, v.rate_high), abs=1e-9), (n, k, d)
        assert because == v.because, (n, k, d)


def test_the_shipped_rules_say_what_each_deterministic_class_follows_from():
    assert deterministic_classes(load_rules()) == {
        "gpu_model": ("gpu_arch_unsupported",),
        "driver_version": ("driver_mismatch",),
        "image": ("missing_library", "protocol_mismatch"),
        "host": ("gpu_hardware_error", "illegal_instruction", "io_error"),  # the host's GPU, CPU or disk
    }
    flaky = {
        "cuda_out_of_memory",
        "daemon_crashed",
        "illegal_memory_access",
        "timeout",
        "network_error",
        "rpc_rejected",
        "oom_killed",
        "unknown",
    }
    assert not flaky & {c for cs in deterministic_classes(load_rules()).values() for c in cs}


def test_deterministic_true_means_the_gpu_model_and_a_wrong_value_is_refused():
    table = parse_rules('[[rule]]\nclass = "x"\nhint = "h"\ndeterministic = true\n')
    assert table.rules[0].deterministic_for == "gpu_model" and table.rules[0].deterministic
    with pytest.raises(ConfigError, match="deterministic must be true, false or one of"):
        parse_rules('[[rule]]\nclass = "x"\nhint = "h"\ndeterministic = "the moon"\n')
