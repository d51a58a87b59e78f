"""The one rule table of instance statuses, rendered into the `instance_status` view every reader uses."""

from __future__ import annotations

from dataclasses import dataclass

from flightrec.schemas import LOST_AFTER_INTERVALS


@dataclass(frozen=True)
class StatusRule:
    """A status, the SQL condition over the `_st` columns that gives it, and what it means."""

    status: str
    condition: str
    meaning: str


# An instance whose clock is off by more than this many seconds is flagged (`clock_skewed`, the instance page
# warns). A synced host is off by milliseconds and the estimate adds only the delivery delay (the agent batches
# for about a second), so 60 s is no pipeline noise; yet a minute already misorders an instance's lines against
# the manager's events or another host's when an operator reads them side by side.
CLOCK_SKEW_BOUND_S = 60

# Tried in order; the first rule that holds is the instance's status. Conditions read the
# columns of the `_st` relation built in INSTANCE_STATUS below. `lost` is the only rule that
# reads the clock (now()), so the tables stay replay-identical: status is derived at read time.
# A silence is counted up to the moment the materializer had committed everything Kafka held
# (materializer_progress, consumers/progress.py; now() where none is recorded: a lake, an older
# file), never beyond: while its input lags or it is away, no instance turns lost for a
# silence it has not read.
# Liveness is judged on the receiver's clock: silent_s counts from when Kafka received the
# latest boot's last event (boots.last_recv_us, the broker's LogAppendTime), never from the
# instance's own timestamps, which a wrong clock moves. Only where no event carries a
# receive time (topics stamped CreateTime, rows folded before) does it fall back to them
# (`liveness_clock` = 'instance'). The destroy rule takes the manager's word when it came after
# the latest boot began by either clock: Kafka received the destroy after the boot's first event
# (an instance whose clock is ahead), or the destroy's time is after the boot's first time (an
# instance whose events Kafka received late, from its spool, after its network was cut).
STATUS_RULES: tuple[StatusRule, ...] = (
    StatusRule(
        "forgotten",
        "manager_kind = 'forgotten' AND coalesce(manager_recv_us >= boot_last_recv_us, "
        "manager_ts_us >= boot_last_us, true)",
        "the manager said it should never have existed (`flightrec manager forget`), and nothing was heard from it "
        "after; left out of the fleet view and its alerts",
    ),
    StatusRule(
        "destroyed",
        "manager_kind = 'destroyed' AND (coalesce(boot_first_us, 0) <= manager_ts_us "
        "OR boot_first_recv_us <= manager_recv_us)",
        "the manager said it destroyed the instance (after its latest boot began), complete or not",
    ),
    StatusRule(
        "failed",
        "failure_class IS NOT NULL AND failure_class <> 'below_min_rate'",
        "a stage of the latest boot failed; `failure_class` says how",
    ),
    StatusRule(
        "below_min_rate",
        "failure_class = 'below_min_rate' OR (verdict = 'fail' AND proofs_per_hour < min_rate)",
        "the benchmark ran but measured fewer proofs/hour than MIN_RATE",
    ),
    StatusRule("finished", "sealed", "the latest boot is sealed and nothing failed"),
    StatusRule(
        "lost",
        f"NOT sealed AND interval_s > 0 AND silent_s > {LOST_AFTER_INTERVALS} * interval_s",
        f"not sealed and nothing heard for {LOST_AFTER_INTERVALS} heartbeat intervals",
    ),
    StatusRule(
        "healthy",
        "running_stages IS NOT NULL AND verdict = 'pass'",
        "the benchmark passed and a stage (the supervisor) is proving, heartbeats fresh",
    ),
    StatusRule("running", "running_stages IS NOT NULL", "a stage is in progress, heartbeats fresh"),
    StatusRule("idle", "true", "not sealed, no stage in progress, not (yet) silent for long"),
)
STATUSES: tuple[str, ...] = tuple(r.status for r in STATUS_RULES)


def status_case() -> str:
    """The rule table as one SQL CASE expression."""
    whens = "\n        ".join(f"WHEN {r.condition} THEN '{r.status}'" for r in STATUS_RULES[:-1])
    return f"CASE\n        {whens}\n        ELSE '{STATUS_RULES[-1].status}'\n    END"


INSTANCE_STATUS = f"""
CREATE OR REPLACE TEMP VIEW instance_status AS
WITH lf AS (
    SELECT f.instance_id, arg_max(f.failure_class, f.ts_us) AS failure_class, arg_max(f.stage, f.ts_us) AS failed_stage,
           max(f.ts_us) AS failed_us
    FROM failures f JOIN instances i ON f.instance_id = i.instance_id AND f.boot_id = i.boot_id
    GROUP BY f.instance_id),
rs AS (SELECT instance_id, stages AS running_stages FROM running_stages WHERE stages IS NOT NULL),
mg AS (
    SELECT instance_id, arg_max(kind, (ts_us, seq, event_id)) AS manager_kind, max(ts_us) AS manager_ts_us,
           arg_max(detail, (ts_us, seq, event_id)) AS manager_detail,
           arg_max(source_id, (ts_us, seq, event_id)) AS manager_source,
           arg_max(recv_us, (ts_us, seq, event_id)) AS manager_recv_us
    FROM manager_events WHERE kind IN ('rented', 'destroyed', 'released', 'rebooted', 'forgotten')
    GROUP BY instance_id),
hu AS (SELECT least(max(caught_up_us), epoch_us(now())) AS heard_until_us FROM materializer_progress),
_st AS (
    SELECT i.instance_id, i.sealed, i.verdict, i.proofs_per_hour, i.min_rate,
           b.first_event_us AS boot_first_us, b.last_event_us AS boot_last_us, b.first_recv_us AS boot_first_recv_us,
           b.last_recv_us AS boot_last_recv_us,
           lf.failure_class, lf.failed_stage, rs.running_stages,
           h.last_us AS last_heartbeat_us, h.interval_s,
           CASE WHEN b.last_recv_us IS NOT NULL THEN 'receiver' ELSE 'instance' END AS liveness_clock,
           coalesce(b.last_recv_us, greatest(h.last_us, b.last_event_us)) AS last_sign_us,
           CASE WHEN b.last_recv_us IS NOT NULL THEN h.last_recv_us ELSE h.last_us END AS last_heartbeat_heard_us,
           (coalesce(hu.heard_until_us, epoch_us(now()))
            - coalesce(b.last_recv_us, greatest(h.last_us, b.last_event_us))) / 1e6 AS silent_s,
           b.clock_offset_us,
           mg.manager_kind, mg.manager_ts_us, mg.manager_detail, mg.manager_source, mg.manager_recv_us
    FROM instances i CROSS JOIN hu
    LEFT JOIN boots b ON b.instance_id = i.instance_id AND b.boot_id = i.boot_id
    LEFT JOIN heartbeats h ON h.instance_id = i.instance_id AND h.boot_id = i.boot_id
    LEFT JOIN lf ON lf.instance_id = i.instance_id
    LEFT JOIN rs ON rs.instance_id = i.instance_id
    LEFT JOIN mg ON mg.instance_id = i.instance_id),
_ss AS (SELECT *, {status_case()} AS status FROM _st)
SELECT instance_id, status,
       CASE status
           WHEN 'destroyed' THEN 'destroyed by ' || manager_source || ' at '
                || strftime(make_timestamp(manager_ts_us), '%Y-%m-%d %H:%M:%S')
                || CASE WHEN coalesce(manager_detail, '') <> '' THEN ': ' || manager_detail ELSE '' END
           WHEN 'forgotten' THEN 'forgotten by ' || manager_source
                || CASE WHEN coalesce(manager_detail, '') <> '' THEN ': ' || manager_detail ELSE '' END
           WHEN 'failed' THEN failed_stage || ' failed: ' || failure_class
           WHEN 'below_min_rate' THEN coalesce(round(proofs_per_hour, 1)::VARCHAR, '?') || ' proofs/h < min '
                || coalesce(round(min_rate, 1)::VARCHAR, '?')
           WHEN 'lost' THEN 'lost contact ' || CASE WHEN silent_s < 120 THEN floor(silent_s)::BIGINT || ' s'
                                                    WHEN silent_s < 7200 THEN floor(silent_s / 60)::BIGINT || ' min'
                                                    WHEN silent_s < 172800 THEN floor(silent_s / 3600)::BIGINT || ' h'
                                                    ELSE floor(silent_s / 86400)::BIGINT || ' d' END
                || ' ago (no heartbeat since '
                || strftime(make_timestamp(coalesce(last_heartbeat_heard_us, last_sign_us)), '%Y-%m-%d %H:%M:%S')
                || CASE WHEN liveness_clock = 'instance' THEN ' by its own clock' ELSE '' END || ')'
           WHEN 'finished' THEN 'sealed cleanly'
           WHEN 'healthy' THEN 'benchmark passed; running ' || running_stages
           WHEN 'running' THEN 'running ' || running_stages
           ELSE 'no stage in progress'
       END AS status_detail,
       failure_class, failed_stage, running_stages,
       last_heartbeat_us, make_timestamptz(last_heartbeat_us) AS last_heartbeat_at,
       interval_s AS heartbeat_interval_s, round(silent_s, 1) AS silent_s,
       last_sign_us, make_timestamptz(last_sign_us) AS last_sign_at, liveness_clock,
       round(clock_offset_us / 1e6, 1) AS clock_offset_s,  -- a duration: no *_us, which the views pair with *_at
       coalesce(abs(clock_offset_us) > {CLOCK_SKEW_BOUND_S} * 1000000, false) AS clock_skewed,
       manager_kind, manager_ts_us, make_timestamptz(manager_ts_us) AS manager_ts_at, manager_detail, manager_source
FROM _ss
"""
