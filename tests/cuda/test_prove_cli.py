"""`flightrec prove bench` as a subprocess against the real broker, and (when built) the materializer."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import duckdb
import pytest
from flightrec.schemas import TOPIC_LIFECYCLE, TOPIC_METRICS, BenchmarkResult, Lifecycle, Throughput, decode

pytestmark = pytest.mark.integration
FLIGHTREC = str(Path(sys.executable).with_name("flightrec"))


def _bench(kafka, tmp_path: Path, instance: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = kafka.env(FLIGHTREC_SPOOL=str(tmp_path / f"spool-{instance}"), PYTHONSAFEPATH="1")
    return subprocess.run(
        [FLIGHTREC, "prove", "bench", "--instance", instance, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _events(kafka, instance: str, topics: tuple[str, ...]) -> list:
    # The session's topics also hold other tests' messages, bad bytes included: filter by key first.
    out = [decode(m.value) for m in kafka.consume(topics) if m.key == instance.encode()]
    return sorted(out, key=lambda e: e.seq)


def test_cpu_bench_sends_throughput_to_the_metrics_topic(kafka, tmp_path: Path) -> None:
    instance = f"prove-{uuid.uuid4()}"
    proc = _bench(kafka, tmp_path, instance, "--backend", "cpu", "--k", "10", "--warmup", "1", "--proofs", "2")
    assert proc.returncode == 0, proc.stderr
    events = _events(kafka, instance, (TOPIC_METRICS,))
    tps = [e for e in events if isinstance(e, Throughput)]
    assert [t.phase for t in tps] == ["warmup", "measured", "measured"]
    assert all(t.backend == "cpu" and t.params["k"] == "10" and len(t.params["root"]) == 64 for t in tps)
    (result,) = [e for e in events if isinstance(e, BenchmarkResult)]
    assert result.verdict == "pass" and result.proofs == 2


def test_cuda_bench_without_a_gpu_fails_with_the_cause_on_the_broker(kafka, tmp_path: Path) -> None:
    import importlib.util

    from flightrec.cuda import driver

    if importlib.util.find_spec("pycuda") is not None:
        pytest.skip("pycuda is installed here: this test is for machines without a GPU stack")
    try:
        driver.load()
        pytest.skip("an NVIDIA driver (libcuda) is here: this test is for machines without one")
    except driver.DriverError:
        pass
    instance = f"prove-{uuid.uuid4()}"
    proc = _bench(kafka, tmp_path, instance, "--backend", "cuda", "--k", "10")
    assert proc.returncode == 2, proc.stderr
    assert "pycuda is not installed" in proc.stderr and "libcuda could not be loaded" in proc.stderr
    events = _events(kafka, instance, (TOPIC_LIFECYCLE, TOPIC_METRICS))
    failed = [e for e in events if isinstance(e, Lifecycle) and e.state == "failed" and e.stage == "benchmark"]
    assert len(failed) == 1
    assert "pycuda is not installed" in failed[0].attributes["cuda_error"]
    assert {"device", "compute_capability", "driver_version"} <= set(failed[0].attributes)
    (result,) = [e for e in events if isinstance(e, BenchmarkResult)]
    assert result.verdict == "error" and result.backend == "cuda"


def test_materializer_turns_the_benchmark_into_throughput_rows(kafka, tmp_path: Path) -> None:
    instance = f"prove-{uuid.uuid4()}"
    proc = _bench(kafka, tmp_path, instance, "--backend", "cpu", "--k", "9", "--warmup", "0", "--proofs", "2")
    assert proc.returncode == 0, proc.stderr
    db = tmp_path / "fr.duckdb"
    kafka.seed_at_mark(db)
    mat = subprocess.run(
        [FLIGHTREC, "materialize", "--db", str(db), "--until-idle", "3", "--no-serve"],
        env=kafka.env(PYTHONSAFEPATH="1"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert mat.returncode == 0, mat.stderr
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT kind, phase, backend, proofs, proofs_per_hour FROM throughput WHERE instance_id = ? ORDER BY seq",
            [instance],
        ).fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        ("sample", "measured", "cpu", 1),
        ("sample", "measured", "cpu", 1),
        ("result", None, "cpu", 2),
    ]
    assert all(r[4] > 0 for r in rows)
