"""One exception root for flightrec; every message says what to do."""

from __future__ import annotations


class FlightrecError(Exception):
    """Root of every error flightrec raises on purpose; the message always says what to do.

    Whether to retry is decided where the failure is met (the materializer's read
    loop waits for a broker that went away; the agent's deliverer keeps events in
    its spool), not by a flag on the error.
    """


class ConfigError(FlightrecError):
    """A flag, environment variable or file holds a value flightrec cannot use."""


class CredentialError(ConfigError):
    """The broker refuses the Kafka credential in use (authorization or authentication): no retry changes that; the
    message names the credential's user and role, what it may not do, and which credential would
    (flightrec/access.py)."""


class MissingExtraError(FlightrecError):
    """A command needs a package of an extra (``server``, ``gpu``) that this installation lacks: install the extra."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(f"needs the {extra} extra ({module} is not installed): pip install 'flightrec[{extra}]'")
        self.module = module
        self.extra = extra


class SecretShapesError(ConfigError):
    """A file of secret shapes (FLIGHTREC_SECRET_SHAPES) cannot be used; the message names the shape and the fix."""


class CodecError(FlightrecError):
    """Bytes that are not a flightrec event; ``reason`` says why, in one line.

    Raised for empty or truncated messages, a wrong magic, an unknown schema
    fingerprint, a body that does not decode, or trailing bytes. Callers keep
    the bytes (dead letters) and go on.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ServiceError(FlightrecError):
    """A local service flightrec runs (Kafka, PostgreSQL) could not be fetched, started, reached or stopped.

    ``log_tail`` holds the last lines of the service's own log where there is one; ``log_name`` names it.
    """

    log_name = "service"

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail

    def __str__(self) -> str:
        msg = super().__str__()
        if self.log_tail:
            return f"{msg}\n--- last lines of the {self.log_name} log ---\n{self.log_tail}"
        return msg


class BrokerError(ServiceError):
    """The local Kafka broker could not be fetched, started, reached or stopped."""

    log_name = "broker"


class DeliveryError(FlightrecError):
    """Events could not be handed to Kafka in time; they stay in the spool."""


class SpoolError(FlightrecError):
    """The agent's on-disk spool is unreadable or cannot be written."""


class MaterializeError(FlightrecError):
    """The materializer cannot consume or write its database."""


class Fenced(MaterializeError):
    """A lake commit was refused: another group member has claimed one of its partitions since (a higher epoch).

    Nothing of the batch was written; the member drops those partitions and reads on with what it still owns.
    ``shards`` names the partitions lost.
    """

    def __init__(self, message: str, shards: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.shards = shards


class QueryError(FlightrecError):
    """A reader query was refused (it writes, reads files) or failed."""


class ProveError(FlightrecError):
    """The proving core could not run on the asked-for backend; the message says why."""


class CatalogError(ServiceError):
    """The local PostgreSQL for a DuckLake catalog could not be found, started, reached or stopped."""

    log_name = "PostgreSQL"


class LakeError(FlightrecError):
    """A DuckLake store could not be opened: a missing extension wheel, an unreachable catalog, no data path."""
