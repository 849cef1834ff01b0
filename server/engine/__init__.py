"""tickwire.server.engine: the engine layer, below every transport and adapter.

`Engine` (in `core`) is the composition root: built once, it owns the update graph (`graph`),
the catalog (`catalog`), the one write path (`ingest`), staged exactly-once writes (`staging`),
durable tables (`storage`), the performance tables (`perf_tables`), publishing to subscribers
(`publishing`) and the clock. Everything above is handed the engine and uses its calls; nothing
outside this package names the graph, its lock or its private state (tests/test_layers.py
checks it).
"""
from tickwire.server.engine.catalog import KINDS, TableSpec, is_hidden, is_system, kind_of
from tickwire.server.engine.config import (
                                           Durability,
                                           EncodeLimits,
                                           EngineConfig,
                                           PerfTablesConfig,
                                           PublishingConfig,
                                           StagingLimits,
)
from tickwire.server.engine.core import Engine
from tickwire.server.engine.errors import (
                                           CatalogError,
                                           IngestError,
                                           InputTypeError,
                                           ModeError,
                                           OperationError,
                                           SchemaMismatchError,
                                           TableInUseError,
                                           TableMismatchError,
                                           UnknownColumnError,
                                           UpdateValidationError,
                                           WriteRefused,
                                           WriteTimeout,
)
from tickwire.server.engine.graph.aggspec import Agg
from tickwire.server.engine.graph.graph import TableFailedError
from tickwire.server.engine.graph.sources import UpdateSourceTable
from tickwire.server.engine.graph.tables import Table, column_pairs
from tickwire.server.engine.ingest import MODES, Destination

__all__ = ["Agg", "Engine", "EngineConfig", "Durability", "StagingLimits", "PerfTablesConfig", "PublishingConfig",
           "EncodeLimits", "TableSpec", "Destination", "MODES", "KINDS", "Table", "column_pairs", "UpdateSourceTable",
           "kind_of", "is_hidden", "is_system", "CatalogError", "TableMismatchError", "TableInUseError",
           "IngestError", "InputTypeError", "ModeError", "OperationError", "UnknownColumnError", "SchemaMismatchError",
           "WriteRefused", "WriteTimeout", "UpdateValidationError", "TableFailedError"]
