"""Pure search-domain logic: no Dagster import and no file or network I/O in this package."""
