"""The avoid-list's rule, pure: when one GPU model, host or driver has failed often enough to be banned."""

from __future__ import annotations

import math
from dataclasses import dataclass

# The rule (docs/cost.md states it; db/money.py's avoid_list view runs the same in SQL, and
# tests/db/test_avoid.py checks that both agree on a table of counts):
#
# 1. A failure of a *deterministic* class (`deterministic = "gpu_model"` on its rule in db/rules.toml:
#    every card of that model fails the same way) bans that dimension's value after one failure.
# 2. Otherwise a value is banned only when it was rented at least MIN_INSTANCES times and the lower
#    end of the Wilson score interval (95 %, z = 1.96) of its failure rate is at least AVOID_RATE:
#    the rate is that high with 95 % confidence, not by the luck of a few rentals.
AVOID_RATE = 0.25
MIN_INSTANCES = 5
Z = 1.96  # 95 % two-sided (Wilson score interval)
DIMENSIONS = ("gpu_model", "host", "driver_version")


def wilson(failed: int, instances: int, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of ``failed`` of ``instances``: (low, high); (0, 1) when nothing was seen."""
    if instances <= 0:
        return 0.0, 1.0
    n = float(instances)
    p = failed / n
    denom = 1 + z * z / n
    center = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (center - half) / denom), min(1.0, (center + half) / denom)


@dataclass(frozen=True)
class Verdict:
    """Whether one value (a GPU model, host, driver) is banned, its interval, and why (``because`` is a code)."""

    banned: bool
    rate_low: float
    rate_high: float
    because: str  # deterministic | rate | too_few | rate_may_be_low | no_failure


def judge(instances: int, failed: int, deterministic_failed: int = 0) -> Verdict:
    """The avoid-list's rule for one value: ``failed`` of ``instances`` failed, ``deterministic_failed`` of
    them with a class deterministic for this dimension. Pure."""
    low, high = wilson(failed, instances)
    if deterministic_failed > 0:
        return Verdict(True, low, high, "deterministic")
    if failed <= 0:
        return Verdict(False, low, high, "no_failure")
    if instances < MIN_INSTANCES:
        return Verdict(False, low, high, "too_few")
    if low >= AVOID_RATE:
        return Verdict(True, low, high, "rate")
    return Verdict(False, low, high, "rate_may_be_low")


def wilson_sql(failed: str, instances: str, side: int, z: float = Z) -> str:
    """SQL for one end of ``wilson`` (side -1: low, +1: high) over two integer expressions."""
    n = f"({instances})::DOUBLE"
    p = f"(({failed})::DOUBLE / {n})"
    z2 = z * z
    end = (
        f"(({p} + {z2!r} / (2 * {n}) {'-' if side < 0 else '+'} {z!r} * sqrt({p} * (1 - {p}) / {n} "
        f"+ {z2!r} / (4 * {n} * {n}))) / (1 + {z2!r} / {n}))"
    )
    if side < 0:
        return f"CASE WHEN ({instances}) > 0 THEN greatest(0.0, {end}) ELSE 0.0 END"
    return f"CASE WHEN ({instances}) > 0 THEN least(1.0, {end}) ELSE 1.0 END"


def because_sql(instances: str, failed: str, deterministic_failed: str, low: str) -> str:
    """SQL for ``judge``'s ``because`` over column expressions (``low`` is the interval's low end)."""
    return (
        f"CASE WHEN ({deterministic_failed}) > 0 THEN 'deterministic' WHEN ({failed}) <= 0 THEN 'no_failure' "
        f"WHEN ({instances}) < {MIN_INSTANCES} THEN 'too_few' WHEN ({low}) >= {AVOID_RATE!r} THEN 'rate' "
        "ELSE 'rate_may_be_low' END"
    )
