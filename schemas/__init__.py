"""The one contract every part shares: Avro schemas, the event model and the wire codec."""

from flightrec.errors import CodecError
from flightrec.schemas.codec import (
    HEADER_LEN,
    MAGIC,
    Codec,
    SchemaVersion,
    decode,
    decode_record,
    default_codec,
    encode,
    schema_fingerprint,
)
from flightrec.schemas.events import (
    EVENT_BY_NAME,
    EVENT_TYPES,
    PHASES,
    STAGE_STATES,
    VERDICTS,
    BenchmarkResult,
    Dropped,
    Event,
    FileTail,
    InstanceFacts,
    Lifecycle,
    LogBatch,
    ProcessExit,
    Sealed,
    Throughput,
    new_event_id,
    now_us,
)
from flightrec.settings import TOPIC_EXITS, TOPIC_LIFECYCLE, TOPIC_LOGS, TOPIC_METRICS, TOPICS

__all__ = [
    # events
    "Event",
    "Lifecycle",
    "InstanceFacts",
    "LogBatch",
    "FileTail",
    "ProcessExit",
    "Throughput",
    "BenchmarkResult",
    "Sealed",
    "Dropped",
    "EVENT_TYPES",
    "EVENT_BY_NAME",
    "STAGE_STATES",
    "PHASES",
    "VERDICTS",
    "new_event_id",
    "now_us",
    # codec
    "Codec",
    "SchemaVersion",
    "CodecError",
    "MAGIC",
    "HEADER_LEN",
    "encode",
    "decode",
    "decode_record",
    "default_codec",
    "schema_fingerprint",
    # topics
    "TOPICS",
    "TOPIC_LIFECYCLE",
    "TOPIC_LOGS",
    "TOPIC_EXITS",
    "TOPIC_METRICS",
]
