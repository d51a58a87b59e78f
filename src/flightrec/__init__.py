"""flightrec: a flight recorder for fleets of rented GPU proving machines."""

from flightrec.errors import (
    BrokerError,
    CodecError,
    ConfigError,
    FlightrecError,
)

__version__ = "0.1.0"

__all__ = [
    # errors
    "FlightrecError",
    "BrokerError",
    "CodecError",
    "ConfigError",
    "__version__",
]
