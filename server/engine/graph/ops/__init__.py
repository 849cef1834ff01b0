"""Derived tables: sort, where, view/select, head/tail and last_by, each incremental.

Every operation follows its parent's update of the cycle with work proportional to that update
(bulk numpy / pyarrow / roaring), and emits one `TableUpdate` that validates against its previous
and new row sets. Values are never copied: an operation reads its parent's storage through its own
row keys (`_slots`), except `select`, which stores the columns it computes.

Row keys:
- `where`, `view`, `select`, `head`, `tail` keep the parent's row keys (and pass its shifts on);
- `sort` has its own sparse key space (`OrderIndex`): keys follow the sort order with free keys
  between neighbours, so a row usually goes in without moving others; when it cannot, a window of
  neighbours is re-spread and the rows that move are reported as shifts. A modification of a sort
  column that keeps the row between its neighbours stays a modification; one that moves the row is
  a remove plus an add;
- `last_by` gives each group a row key when the group first appears (in the order of its first
  row) and keeps it while the group has rows; groups are never shifted. Once many groups have
  emptied, their ids and row keys go to new groups (a cycle after their removal), so its memory
  follows the live groups; over an AddOnly parent it keeps nothing per parent row;
- `agg_by` (a group's id is its row key) and `head_by`/`tail_by` (a block of row keys per group)
  reuse the ids of emptied groups the same way (`GroupIds`).

The row set of an operation lives in a private roaring bitmap changed in place each cycle; the
immutable `rowset` is built from it only when read (and the previous one is kept or rebuilt from
the update on demand), so a cycle costs what the change costs even on very large tables.
"""
from tickwire.server.engine.graph.ops.aggregate import Agg, AggregateTable
from tickwire.server.engine.graph.ops.as_of_join import AsOfJoinTable
from tickwire.server.engine.graph.ops.base import expression_columns, shifted_rows, unique_name
from tickwire.server.engine.graph.ops.cross_join import CrossJoinTable
from tickwire.server.engine.graph.ops.head_tail import HeadTailTable
from tickwire.server.engine.graph.ops.head_tail_by import HeadTailByTable
from tickwire.server.engine.graph.ops.last_by import LastByTable
from tickwire.server.engine.graph.ops.merge import MergeTable
from tickwire.server.engine.graph.ops.multi_join import MultiJoinTable
from tickwire.server.engine.graph.ops.natural_join import NaturalJoinTable
from tickwire.server.engine.graph.ops.project import ProjectTable
from tickwire.server.engine.graph.ops.slice_flatten import FlattenTable, SliceTable
from tickwire.server.engine.graph.ops.snapshot_when import SnapshotWhenTable
from tickwire.server.engine.graph.ops.sort import SortTable
from tickwire.server.engine.graph.ops.ungroup import UngroupTable
from tickwire.server.engine.graph.ops.update_by import UpdateByOp, UpdateByTable
from tickwire.server.engine.graph.ops.where import WhereTable
from tickwire.server.engine.graph.ops.where_in import WhereInTable

__all__ = ["Agg", "AggregateTable",
           "SortTable", "WhereTable", "ProjectTable", "HeadTailTable", "HeadTailByTable", "LastByTable", "SliceTable",
           "FlattenTable", "UngroupTable", "NaturalJoinTable", "WhereInTable", "MergeTable", "AsOfJoinTable",
           "CrossJoinTable", "MultiJoinTable", "SnapshotWhenTable", "UpdateByOp", "UpdateByTable",
           "unique_name",
           "expression_columns", "shifted_rows"]
