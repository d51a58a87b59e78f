"""Missing facts are NULL, never '': the fold stores a failed GPU probe's empty fields as NULL."""

from __future__ import annotations

import uuid

from flightrec.db.fold import fold, missing_facts_as_null
from flightrec.schemas import TOPIC_LIFECYCLE, InstanceFacts, encode


class _Msg:
    def __init__(self, value: bytes, offset: int) -> None:
        self.topic, self.partition, self.offset, self.key, self.value = TOPIC_LIFECYCLE, 0, offset, b"i", value


def _facts(**kw: object) -> InstanceFacts:
    return InstanceFacts(
        event_id=str(uuid.uuid4()), instance_id="i-1", boot_id="b-1", seq=0, ts_us=1_750_000_000_000_000, **kw
    )


def test_a_failed_gpu_probe_folds_to_null_facts_not_empty_strings():
    probe_failed = _facts(gpu_probe_error="nvidia-smi not found on PATH", host="h-1")  # '' / 0 for every GPU field
    (row,) = fold([_Msg(encode(probe_failed), 0)]).facts.to_pylist()
    for name in (
        "gpu_model",
        "gpu_count",
        "gpu_memory_mib",
        "driver_version",
        "cuda_version",
        "compute_capability",
        "cpu_model",
        "cpu_count",
        "ram_mib",
        "image",
    ):
        assert row[name] is None, name
    assert row["host"] == "h-1" and row["gpu_probe_error"] == "nvidia-smi not found on PATH"


def test_known_facts_are_kept_as_they_are():
    rec = {"gpu_model": "NVIDIA L40S", "gpu_count": 2, "gpu_probe_error": None, "price_per_hour": 0.0}
    assert missing_facts_as_null(rec) == rec  # a price of 0 is a price: only the unknown-when-empty facts change
