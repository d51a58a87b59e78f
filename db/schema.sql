-- The materialized tables: the contract between the materializer (consumers/)
-- and every reader (analytics/, `flightrec sql`, `timeline`). Timestamps are
-- microseconds since the Unix epoch, UTC (BIGINT, `*_us`), exactly as the
-- events carry them, so a replay reproduces the tables row for row: no column
-- here holds wall-clock time of the materializer. `recv_us` columns hold the
-- broker's clock: when Kafka appended the record (its LogAppendTime timestamp,
-- kept in the topic, so a replay reads the same); NULL where the topic stamps
-- CreateTime (the sender's clock) or the row predates them. New columns may be
-- added (readers select by name); renaming one changes the contract.

-- One row per instance: where it is, what it is, and whether its evidence is complete.
CREATE TABLE IF NOT EXISTS instances (
    instance_id        VARCHAR PRIMARY KEY,
    boot_id            VARCHAR,          -- the latest boot seen
    stage              VARCHAR,          -- stage of the latest lifecycle event
    state              VARCHAR,          -- started / succeeded / failed / skipped / info / sealed
    detail             VARCHAR,
    gpu_model          VARCHAR,
    gpu_count          INTEGER,
    gpu_memory_mib     BIGINT,
    driver_version     VARCHAR,
    cuda_version       VARCHAR,
    compute_capability VARCHAR,
    gpu_probe_error    VARCHAR,
    host               VARCHAR,
    price_per_hour     DOUBLE,
    first_event_us     BIGINT,
    last_event_us      BIGINT,
    proofs_per_hour    DOUBLE,           -- latest benchmark result (or latest measured throughput)
    min_rate           DOUBLE,
    verdict            VARCHAR,          -- pass / fail / error / NULL
    failures           INTEGER DEFAULT 0,
    events             BIGINT DEFAULT 0, -- distinct events of the latest boot
    sealed             BOOLEAN DEFAULT FALSE,
    complete           BOOLEAN DEFAULT FALSE, -- latest boot sealed, its count covering seq 0..count-1 each once and nothing more
    incomplete_reason  VARCHAR,          -- why not complete, e.g. 'not sealed', 'missing seq 17..19'
    dropped_events     BIGINT DEFAULT 0, -- events of the latest boot Kafka refused for good (Dropped markers)
    last_recv_us       BIGINT,           -- when Kafka received its latest event (any boot; the broker's clock)
    clock_offset_us    BIGINT            -- the latest boot's clock minus the broker's (boots.clock_offset_us)
);

-- Completeness bookkeeping per boot (an instance may boot several times).
CREATE TABLE IF NOT EXISTS boots (
    instance_id    VARCHAR,
    boot_id        VARCHAR,
    events         BIGINT,     -- distinct event_ids seen
    max_seq        BIGINT,
    sealed_count   BIGINT,     -- event_count from the sealed event, NULL until sealed
    first_event_us BIGINT,
    last_event_us  BIGINT,
    complete       BOOLEAN,
    incomplete_reason VARCHAR, -- NULL when complete
    dropped_events BIGINT DEFAULT 0, -- Dropped markers: events Kafka refused for good (their seq is kept)
    first_recv_us  BIGINT,     -- when Kafka received the boot's first / latest event (the broker's clock;
    last_recv_us   BIGINT,     -- NULL when no event of the boot carries a LogAppendTime)
    clock_offset_us BIGINT,    -- the instance's clock minus the broker's: the median of ts_us - recv_us over
                               -- the boot's latest 32 events by seq (positive: the instance's clock is ahead)
    PRIMARY KEY (instance_id, boot_id)
);

CREATE TABLE IF NOT EXISTS lifecycle_events (
    event_id    VARCHAR PRIMARY KEY,
    instance_id VARCHAR,
    boot_id     VARCHAR,
    seq         BIGINT,
    ts_us       BIGINT,
    kind        VARCHAR,      -- lifecycle / facts / sealed / dropped (a marker for an event Kafka refused)
    stage       VARCHAR,
    state       VARCHAR,
    detail      VARCHAR,
    attributes  MAP(VARCHAR, VARCHAR),
    event_count BIGINT        -- sealed events only: the boot's event count
);

-- One row per line. `source` is stdout, stderr or the followed file's path. The five columns a LogBatch repeats on
-- each of its lines are dictionary-compressed by fiat: DuckDB would analyse every method for them in each row group
-- (~17% of a commit's insert, measured alone).
CREATE TABLE IF NOT EXISTS log_lines (
    instance_id  VARCHAR USING COMPRESSION dictionary,
    boot_id      VARCHAR USING COMPRESSION dictionary,
    event_id     VARCHAR USING COMPRESSION dictionary, -- the LogBatch the line came in
    seq          BIGINT,
    stage        VARCHAR USING COMPRESSION dictionary,
    source       VARCHAR USING COMPRESSION dictionary,
    pid          INTEGER,
    line_no      BIGINT,
    ts_us        BIGINT,
    text         VARCHAR,
    truncated    BOOLEAN,
    invalid_utf8 BOOLEAN,
    late         BOOLEAN      -- written after the stage's command exited (by a process it left behind)
);

CREATE TABLE IF NOT EXISTS process_exits (
    event_id     VARCHAR PRIMARY KEY,
    instance_id  VARCHAR,
    boot_id      VARCHAR,
    seq          BIGINT,
    ts_us        BIGINT,
    stage        VARCHAR,
    argv         VARCHAR[],
    pid          INTEGER,
    exit_code    INTEGER,
    signal       INTEGER,
    signal_name  VARCHAR,
    start_error  VARCHAR,
    started_us   BIGINT,
    ended_us     BIGINT,
    duration_s   DOUBLE,
    timed_out    BOOLEAN,
    stdout_tail  VARCHAR[],
    stderr_tail  VARCHAR[],
    file_tails   STRUCT(path VARCHAR, lines VARCHAR[], "exists" BOOLEAN)[]
);

CREATE TABLE IF NOT EXISTS throughput (
    event_id        VARCHAR PRIMARY KEY,
    instance_id     VARCHAR,
    boot_id         VARCHAR,
    seq             BIGINT,
    ts_us           BIGINT,
    kind            VARCHAR,   -- sample (Throughput event) / result (BenchmarkResult event)
    stage           VARCHAR,
    backend         VARCHAR,
    device          VARCHAR,
    phase           VARCHAR,   -- warmup / measured for samples, NULL for results
    proofs          INTEGER,
    seconds         DOUBLE,
    proofs_per_hour DOUBLE,
    min_rate        DOUBLE,    -- results only
    verdict         VARCHAR,   -- results only: pass / fail / error
    detail          VARCHAR,
    params          MAP(VARCHAR, VARCHAR)
);

-- One row per failed stage, with everything that explains it.
CREATE TABLE IF NOT EXISTS failures (
    failure_id         VARCHAR PRIMARY KEY, -- event_id of the event that revealed the failure
    instance_id        VARCHAR,
    boot_id            VARCHAR,
    stage              VARCHAR,
    ts_us              BIGINT,
    exit_code          INTEGER,
    signal             INTEGER,
    signal_name        VARCHAR,
    start_error        VARCHAR,
    detail             VARCHAR,              -- the failed lifecycle event's detail / benchmark detail
    stderr_tail        VARCHAR[],
    stdout_tail        VARCHAR[],
    file_tails         STRUCT(path VARCHAR, lines VARCHAR[], "exists" BOOLEAN)[],
    preceding_events   VARCHAR[],            -- the lifecycle events that led to it, as 'stage state detail'
    gpu_model          VARCHAR,
    compute_capability VARCHAR,
    driver_version     VARCHAR,
    cuda_version       VARCHAR,
    proofs_per_hour    DOUBLE,
    min_rate           DOUBLE,
    failure_class      VARCHAR,
    hint               VARCHAR,
    matched_line       VARCHAR,              -- the old name of decisive_line (migration 7), the same value
    killed_by          VARCHAR,              -- the signal behind the failure (SIGSEGV), also one a process the stage
                                             -- started died of, as its wrapper reported; NULL: none
    killed_by_evidence VARCHAR               -- where killed_by was read (the exit, 128+n, the line)
);

-- Heartbeats, summarised per boot (not one row each: events_seen already proves their seq).
-- Merged by upsert; every column is a function of the boot's heartbeat set, so replay agrees.
CREATE TABLE IF NOT EXISTS heartbeats (
    instance_id VARCHAR,
    boot_id     VARCHAR,
    beats       BIGINT,       -- distinct heartbeats seen
    first_us    BIGINT,
    last_us     BIGINT,       -- the latest heartbeat's time (ts_us)
    last_seq    BIGINT,
    interval_s  DOUBLE,       -- the interval the latest heartbeat announced (FLIGHTREC_HEARTBEAT_S)
    stage       VARCHAR,      -- the stage the latest heartbeat was sent for
    last_recv_us BIGINT,      -- when Kafka received the latest heartbeat (the broker's clock; NULL: unknown)
    PRIMARY KEY (instance_id, boot_id)
);

-- The stages in progress in each instance's latest boot (started, no end yet), derived from
-- lifecycle_events like instances, so the status view need not scan every lifecycle event.
CREATE TABLE IF NOT EXISTS running_stages (
    instance_id VARCHAR PRIMARY KEY,
    boot_id     VARCHAR,
    stages      VARCHAR       -- comma separated, sorted; NULL when none
);

-- Events about an instance from the manager's side (`flightrec manager event`): their
-- boot_id/seq are the sender's own, so they never touch the instance's boots.
CREATE TABLE IF NOT EXISTS manager_events (
    event_id    VARCHAR PRIMARY KEY,
    instance_id VARCHAR,
    boot_id     VARCHAR,      -- the manager source's boot, not the instance's
    seq         BIGINT,
    ts_us       BIGINT,
    source_id   VARCHAR,      -- who sent it, e.g. manager@controller
    kind        VARCHAR,      -- rented / destroyed / note / rebooted / released
    detail      VARCHAR,
    attributes  MAP(VARCHAR, VARCHAR),
    recv_us     BIGINT        -- when Kafka received it (the broker's clock; NULL: unknown)
);

CREATE TABLE IF NOT EXISTS dead_letters (
    topic       VARCHAR,
    "partition" INTEGER,
    "offset"    BIGINT,
    key         BLOB,
    value       BLOB,
    reason      VARCHAR,
    PRIMARY KEY (topic, "partition", "offset")
);

-- The consumer's own position, committed in the same transaction as the rows.
CREATE TABLE IF NOT EXISTS consumer_offsets (
    consumer_group VARCHAR,
    topic          VARCHAR,
    "partition"    INTEGER,
    next_offset    BIGINT,
    PRIMARY KEY (consumer_group, topic, "partition")
);

-- Every distinct event the materializer has folded (one row per event, not per
-- line): the dedupe set for all topics and the source of the seq bookkeeping.
CREATE TABLE IF NOT EXISTS events_seen (
    event_id    VARCHAR PRIMARY KEY,
    instance_id VARCHAR,
    boot_id     VARCHAR,
    seq         BIGINT,
    ts_us       BIGINT,
    kind        VARCHAR,      -- lifecycle / facts / sealed / dropped / log / exit / sample / result / heartbeat
    stage       VARCHAR,
    fingerprint BIGINT,       -- CRC-32 and length of the message: the same id with other bytes is a dead letter
    recv_us     BIGINT        -- when Kafka received it (the broker's clock; NULL: unknown, see above)
);

-- Every InstanceFacts event, whole (instances holds the latest GPU facts).
CREATE TABLE IF NOT EXISTS instance_facts (
    event_id           VARCHAR PRIMARY KEY,
    instance_id        VARCHAR,
    boot_id            VARCHAR,
    seq                BIGINT,
    ts_us              BIGINT,
    gpu_model          VARCHAR,
    gpu_count          INTEGER,
    gpu_memory_mib     BIGINT,
    driver_version     VARCHAR,
    cuda_version       VARCHAR,
    compute_capability VARCHAR,
    gpu_probe_error    VARCHAR,
    host               VARCHAR,
    cpu_model          VARCHAR,
    cpu_count          INTEGER,
    ram_mib            BIGINT,
    image              VARCHAR,
    price_per_hour     DOUBLE,
    attributes         MAP(VARCHAR, VARCHAR)
);

-- Run bookkeeping (wall-clock time of the materializer, not of events): NOT part
-- of the materialized state, so replays differ here and only here (and in
-- consumer_offsets' group names).
CREATE TABLE IF NOT EXISTS materializer_runs (
    run_id          VARCHAR PRIMARY KEY,
    consumer_group  VARCHAR,
    mode            VARCHAR,    -- materialize / replay
    started_us      BIGINT,
    last_commit_us  BIGINT,
    commits         BIGINT,
    messages        BIGINT,
    lines           BIGINT,
    duplicates      BIGINT,
    dead_letters    BIGINT
);

-- When each materializer run last had committed everything Kafka held when it asked (its input caught up; the
-- materializer's wall-clock time, like materializer_runs): instance silences are judged up to the latest of these
-- (db/status.py), so a materializer whose input lags or that is away judges no instance lost.
CREATE TABLE IF NOT EXISTS materializer_progress (
    run_id       VARCHAR PRIMARY KEY,  -- materializer_runs.run_id
    caught_up_us BIGINT
);

-- The schema versions applied to this database (db/migrate.py): columns added
-- after the first release are added there, by version, on a file and a lake alike.
CREATE TABLE IF NOT EXISTS schema_version (
    version     INTEGER,
    what        VARCHAR,
    applied_us  BIGINT,     -- wall-clock time of the materializer that applied it
    run_id      VARCHAR     -- materializer_runs.run_id of that materializer
);
