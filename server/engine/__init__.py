"""tickwire.server.engine: the engine layer, below every transport and adapter.

The update graph (`graph`), publishing to subscribers (`publishing`), durable tables
(`storage`), the catalog, ingest and reading calls (`core`), the write modes (`ingest`), staged
exactly-once writes (`staging`) and the performance tables (`perf_tables`). Nothing outside this
package takes the graph's lock or reads its private state.
"""
from tickwire.server.engine.core import (KINDS, CatalogError, Engine, IngestError, TableInUseError, TableMismatchError,
                                         TableSpec, UpdateSourceTable, engine_of, is_hidden, is_system, kind_of)

__all__ = ["Engine", "TableSpec", "UpdateSourceTable", "CatalogError", "TableMismatchError", "TableInUseError",
           "IngestError", "KINDS", "engine_of", "kind_of", "is_hidden", "is_system"]
