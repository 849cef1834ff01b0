"""tickwire.server.engine.graph: the table update model (row sets, updates, tables, the update graph)."""
from tickwire.server.engine.errors import SchemaMismatchError, UpdateValidationError
from tickwire.server.engine.graph.column_store import ColumnStore, equal_mask, hash_columns
from tickwire.server.engine.graph.graph import CycleErrorRecord, UpdateGraph
from tickwire.server.engine.graph.keyindex import KeyIndex
from tickwire.server.engine.graph.keymap import KeyMap
from tickwire.server.engine.graph.ops import HeadTailTable, LastByTable, ProjectTable, SortTable, WhereTable
from tickwire.server.engine.graph.order import OrderIndex, SortKeys
from tickwire.server.engine.graph.row_set import RowSet, RowSetShiftData, RowSetShiftDataBuilder
from tickwire.server.engine.graph.sources import AppendOnlyTable, BlinkTable, KeyedTable, RingTable, SourceTable
from tickwire.server.engine.graph.table_update import ROW_KEY, ModifiedColumnSet, TableUpdate, apply_update
from tickwire.server.engine.graph.tables import StaticTable, Table

__all__ = [
    "UpdateGraph", "CycleErrorRecord",
    "RowSet", "RowSetShiftData", "RowSetShiftDataBuilder",
    "TableUpdate", "ModifiedColumnSet", "UpdateValidationError", "apply_update", "ROW_KEY",
    "Table", "StaticTable", "SourceTable", "AppendOnlyTable", "KeyedTable", "BlinkTable", "RingTable",
    "SchemaMismatchError",
    "ColumnStore", "KeyIndex", "equal_mask", "hash_columns",
    "SortTable", "WhereTable", "ProjectTable", "HeadTailTable", "LastByTable", "OrderIndex", "SortKeys", "KeyMap",
]
