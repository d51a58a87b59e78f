"""Shared fixtures: a real Kafka broker (KRaft) and a real PostgreSQL (a lake's catalog), each once per session."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from flightrec.broker import LocalBroker
from flightrec.catalog import LocalCatalog

from flightrec.errors import ServiceError
from flightrec.localservice import free_port
from flightrec.settings import TOPICS, Settings

S = TypeVar("S", LocalBroker, LocalCatalog)

logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
# Kafka's jars: the checkout's .cache (as `make` sets it), wherever pytest is started from.
os.environ.setdefault("FLIGHTREC_CACHE", str(Path(__file__).resolve().parents[1] / ".cache"))


Mark = dict[tuple[str, int], int]  # (topic, partition) -> offset


@dataclasses.dataclass
class Kafka:
    """A running local broker and helpers to read and write its topics in tests.

    The session broker's topics hold every earlier test's events. ``mark`` (set by the autouse
    ``topics_mark`` fixture before each test that uses ``kafka``: the end offsets then) is where
    :meth:`consume` and the materializer helpers start, so a test reads only what it produced
    and never an earlier test's leftovers. A partition with no mark is read from its beginning.
    """

    broker: LocalBroker
    mark: Mark | None = None

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def settings(self) -> Settings:
        return dataclasses.replace(Settings.from_env({}), bootstrap=self.bootstrap)

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ plus FLIGHTREC_BOOTSTRAP pointing at this broker (for subprocesses)."""
        env = dict(os.environ)
        env["FLIGHTREC_BOOTSTRAP"] = self.bootstrap
        env.update(extra)
        return env

    def produce(self, topic: str, values: list[bytes], key: bytes | None = None) -> None:
        """Send raw messages with acks=all and wait for them."""

        async def go() -> None:
            from aiokafka import AIOKafkaProducer

            p = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True)
            await p.start()
            try:
                for v in values:
                    await p.send(topic, v, key=key)
                await p.flush()
            finally:
                await p.stop()

        asyncio.run(go())

    def end_offsets(self, topics: tuple[str, ...] = TOPICS) -> Mark:
        """The end offset of every partition of the topics now (partitions from the admin client)."""

        async def go() -> Mark:
            from aiokafka import AIOKafkaConsumer, TopicPartition

            from flightrec.cluster import partitions_now

            parts = [
                TopicPartition(t, p) for t, p in await partitions_now({"bootstrap_servers": self.bootstrap}, topics)
            ]
            if not parts:
                return {}
            c = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
            await c.start()
            try:
                return {(tp.topic, tp.partition): o for tp, o in (await c.end_offsets(parts)).items()}
            finally:
                await c.stop()

        return asyncio.run(go())

    def start_at_mark(self) -> None:
        """From now on, read the topics from their current end offsets (what this test produces next)."""
        self.mark = self.end_offsets()

    def seed_at_mark(self, db: str | os.PathLike[str], group: str | None = None) -> None:
        """Give a new database the mark as its stored offsets, through the materializer's own FileStore, so a
        materializer (in-process or `flightrec materialize`) starts there, as after a run that read up to it.
        Nothing happens without a mark or when ``db`` exists (a restart goes on from its own offsets)."""
        if not self.mark or Path(db).exists():
            return
        from flightrec.consumers.materializer import DEFAULT_GROUP
        from flightrec.db.filestore import FileStore
        from flightrec.db.fold import fold

        store = FileStore(db, group or DEFAULT_GROUP)
        try:
            store.commit(dataclasses.replace(fold([]), offsets=dict(self.mark)))
        finally:
            store.close()

    def consume(self, topics: tuple[str, ...] = TOPICS, timeout: float = 30.0) -> list:
        """Every message now in the topics from the mark (the beginning without one) to the current end offsets."""

        async def go() -> list:
            from aiokafka import AIOKafkaConsumer, TopicPartition

            from flightrec.cluster import partitions_now

            parts = [
                TopicPartition(t, p) for t, p in await partitions_now({"bootstrap_servers": self.bootstrap}, topics)
            ]
            c = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
            )
            await c.start()
            try:
                assert parts, f"no partitions found for {topics}"
                c.assign(parts)
                mark = self.mark or {}
                unmarked = [tp for tp in parts if (tp.topic, tp.partition) not in mark]
                for tp in parts:
                    if tp not in unmarked:
                        c.seek(tp, mark[(tp.topic, tp.partition)])
                if unmarked:
                    await c.seek_to_beginning(*unmarked)
                end = await c.end_offsets(parts)
                out: list = []
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout

                async def behind() -> bool:
                    return any([(await c.position(tp)) < end[tp] for tp in parts])

                while await behind():
                    if loop.time() > deadline:
                        raise TimeoutError("could not read the topics to their end offsets in time")
                    batch = await c.getmany(timeout_ms=500)
                    for msgs in batch.values():
                        out.extend(msgs)
                return out
            finally:
                await c.stop()

        return asyncio.run(go())


def _start_service(data: Path, make: Callable[[int, Path], S], what: str) -> S:
    """Start a local service (Kafka, PostgreSQL) on a free port; one retry on another port (a busy machine can lose
    the port race)."""
    for attempt in (1, 2):
        service = make(free_port(), data / f"try{attempt}")
        try:
            service.start(timeout=120)
            return service
        except ServiceError as exc:
            service.stop()
            if attempt == 2:
                raise
            logging.getLogger(__name__).warning("%s fixture: retrying on another port after: %s", what, exc)
    raise AssertionError("unreachable")


def _start_broker(data: Path, security: str | None = None) -> LocalBroker:
    return _start_service(
        data,
        lambda port, d: LocalBroker(port=port, data=d, settings=Settings.from_env({}), security=security),
        f"{security or 'plain'} broker",
    )


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kafka]:
    """One real broker for the whole test session (shared topics: filter by instance id)."""
    broker = _start_broker(tmp_path_factory.mktemp("kafka"))
    try:
        yield Kafka(broker)
        _assert_topics_as_created(broker.bootstrap)
    finally:
        broker.stop()


def _assert_topics_as_created(bootstrap: str) -> None:
    """At the end of the session: no test left a shared topic configured otherwise than flightrec creates it. Kafka's
    AlterConfigs replaces a topic's whole configuration, and a topic left stamping CreateTime makes every later test
    on this broker judge receive times by the events' own (fixed, 2025) clocks."""
    from aiokafka.admin import AIOKafkaAdminClient
    from flightrec.broker.topics import topic_config

    from flightrec.cluster import describe_topic_configs

    async def configs() -> dict[str, dict[str, str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            return await describe_topic_configs(admin, TOPICS)
        finally:
            await admin.close()

    wanted = topic_config()
    changed = {t: {k: c.get(k) for k in wanted if c.get(k) != wanted[k]} for t, c in asyncio.run(configs()).items()}
    assert not any(changed.values()), f"a test left the session broker's topics configured otherwise: {changed}"


@pytest.fixture(scope="session")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """One broker requiring SASL_SSL (SCRAM-SHA-512 over TLS) for the session; its client settings in client.env."""
    broker = _start_broker(tmp_path_factory.mktemp("kafka-sasl"), security="sasl_ssl")
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(autouse=True)
def topics_mark(request: pytest.FixtureRequest) -> Iterator[Mark | None]:
    """Before each test that uses the session broker: mark the topics' end offsets (``Kafka.mark``), so what
    the test reads is what it produced. Tests without ``kafka`` get nothing (and start no broker)."""
    if "kafka" not in request.fixturenames:
        yield None
        return
    kafka: Kafka = request.getfixturevalue("kafka")
    kafka.start_at_mark()
    try:
        yield kafka.mark
    finally:
        kafka.mark = None


@pytest.fixture
def fresh_kafka(tmp_path: Path) -> Iterator[Kafka]:
    """A broker of this test's own, for tests that need empty topics or stop the broker."""
    broker = _start_broker(tmp_path / "kafka")
    try:
        yield Kafka(broker)
    finally:
        broker.stop()


def catalog_dir(prefix: str = "flightrec-catalog-") -> Path:
    """A new folder for a PostgreSQL data directory that the `postgres` user can reach when tests run as root
    (pytest's own tmp folders are private to root; PostgreSQL refuses to run as root)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o711)
    return path


def _start_catalog(data: Path) -> LocalCatalog:
    return _start_service(
        data, lambda port, d: LocalCatalog(port=port, data=d, settings=Settings.from_env({})), "catalog"
    )


@pytest.fixture(scope="session")
def pg_catalog() -> Iterator[LocalCatalog]:
    """One real PostgreSQL for the whole session, started by `flightrec catalog`'s own code (never skipped:
    a machine without PostgreSQL fails here, saying what to install)."""
    data = catalog_dir()
    catalog = _start_catalog(data)
    try:
        yield catalog
    finally:
        catalog.stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    """A folder for this test's own PostgreSQL data directories (reachable by `postgres` when run as root)."""
    path = catalog_dir("flightrec-catalog-test-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


_lake_numbers = itertools.count(1)


@pytest.fixture
def lake(pg_catalog: LocalCatalog, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A fresh, empty DuckLake for this test: (the --db string of a new catalog database, its data folder)."""
    name = f"lake_{os.getpid()}_{next(_lake_numbers)}"
    db = pg_catalog.create_database(name)
    data_path = tmp_path / "lake-data"
    data_path.mkdir()
    try:
        yield db, str(data_path)
    finally:
        pg_catalog.drop_database(name)


BROKER_FIXTURES = frozenset({"kafka", "fresh_kafka", "sasl_kafka", "kafka_cluster"})
SERVICE_FIXTURES = BROKER_FIXTURES | {"pg_catalog", "lake", "pg_dir"}  # a real Kafka or a real PostgreSQL


FILE_SECONDS = Path(__file__).with_name("file_seconds.txt")  # scripts/test_seconds.py writes it from a full run


def file_seconds(path: Path = FILE_SECONDS) -> dict[str, float]:
    """The seconds each test file took in a full run, by its path from the repository root ({} without the file)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    rows = (line.split() for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return {name: float(seconds) for seconds, name in rows}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that needs a broker or PostgreSQL, directly or through another fixture, is an integration test
    (marked or not), so `make check` (`-m "not integration and not slow"`) starts neither. The longest files come
    first (``file_seconds``; the Makefile turns off xdist's reordering by test count), so that each of the workers
    ends on short files; within a file the order stays as written."""
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    seconds = file_seconds()
    root = Path(str(config.rootpath))
    items.sort(key=lambda item: -seconds.get(item.path.relative_to(root).as_posix(), 0.0))


@pytest.fixture
def open_page(monkeypatch: pytest.MonkeyPatch):
    """``open_page(db, page=None, **params)``: the dashboard rendered on ``db`` (a file or a lake string), no
    exception."""
    from flightrec.analytics import ENTRY_SCRIPT
    from streamlit.testing.v1 import AppTest

    def open_(db: str | os.PathLike[str], page: str | None = None, **params: str) -> AppTest:
        monkeypatch.setenv("FLIGHTREC_DB", str(db))
        at = AppTest.from_file(str(ENTRY_SCRIPT), default_timeout=120)  # a cap for a loaded machine, not a speed test
        at.run()
        assert not at.exception, at.exception
        if page:
            for k, v in params.items():
                at.query_params[k] = v
            at.switch_page(f"page_{page}.py").run()
            assert not at.exception, at.exception
        return at

    return open_
