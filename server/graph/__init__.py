"""tickwire.server.graph: the table update model (row sets, updates, tables, the update graph)."""
from tickwire.server.graph.graph import ListenerError, UpdateGraph
from tickwire.server.graph.rowset import RowSet, RowSetShiftData
from tickwire.server.graph.tables import (
    AppendOnlyTable,
    BlinkTable,
    KeyedTable,
    RingTable,
    SchemaMismatchError,
    StaticTable,
    Table,
)
from tickwire.server.graph.update import TableUpdate, UpdateValidationError

__all__ = [
    "UpdateGraph", "ListenerError", "RowSet", "RowSetShiftData", "TableUpdate", "UpdateValidationError",
    "Table", "StaticTable", "AppendOnlyTable", "KeyedTable", "BlinkTable", "RingTable", "SchemaMismatchError",
]
