"""A private local PostgreSQL that serves as the catalog of a DuckLake store (`flightrec catalog`)."""

from flightrec.catalog.local import (
    DATABASE,
    DEFAULT_PORT,
    READER,
    CatalogStatus,
    LocalCatalog,
    db_string,
    find_bin_dir,
)

__all__ = ["DATABASE", "DEFAULT_PORT", "READER", "CatalogStatus", "LocalCatalog", "db_string", "find_bin_dir"]
