"""The errors the engine raises on purpose, each a `TickwireError` carrying the gRPC status a server
answers it with. Anything else that escapes the engine is a defect (INTERNAL at the gRPC boundary,
logged with a reference id).

Some also derive from the built-in exception a Python caller would expect (`ValueError` for a
bad argument, `AssertionError` for a broken invariant), so that such code keeps working; the
servers' handlers catch `TickwireError` only.
"""
from __future__ import annotations

from tickwire.errors import TickwireError

__all__ = ["SchemaMismatchError", "OperationError", "UnknownColumnError", "CatalogError", "TableMismatchError",
           "TableInUseError",
           "IngestError", "WriteTimeout", "InputTypeError", "WriteRefused", "ModeError", "UpdateValidationError",
           "TickwireError"]


class OperationError(TickwireError, ValueError):
    """A derived table asked for with arguments it cannot take (an unknown or unsortable column, a
    column named twice, a negative row count); the message names the table and the argument."""

    code = "INVALID_ARGUMENT"


class UnknownColumnError(OperationError, KeyError):
    """A column the table does not have (also a KeyError, for code that looks columns up)."""

    __str__ = Exception.__str__  # the message as written, not quoted as a KeyError's key


class CatalogError(TickwireError, ValueError):
    """A table cannot be made as asked (an unservable type, a bad name, keys not in the schema)."""

    code = "INVALID_ARGUMENT"


class TableMismatchError(CatalogError):
    """A table of that name exists with another kind, other keys or another schema."""

    code = "FAILED_PRECONDITION"


class TableInUseError(CatalogError):
    """A table cannot be dropped while derived tables or subscribers hold it."""

    code = "FAILED_PRECONDITION"


class IngestError(TickwireError):
    """A write a table cannot take (its schema, its kind)."""

    code = "INVALID_ARGUMENT"


class SchemaMismatchError(IngestError, ValueError):
    """Input whose schema does not match the table's; the message names the table, the column
    and both types. Types must be equal (no casts are applied); column order may differ."""


class WriteTimeout(IngestError):
    """No cycle applied a write within the time its writer gave."""

    code = "UNAVAILABLE"


class InputTypeError(IngestError, TypeError):
    """Input that is not rows: a write takes a pyarrow Table, a RecordBatch or a list of them."""


class WriteRefused(IngestError, ValueError):
    """The table takes no writes (its storage failed: what it cannot persist, it does not accept)."""

    code = "UNAVAILABLE"


class ModeError(IngestError, ValueError):
    """A batch or a writer's options that a table cannot take (bad options, an unsupported or
    changed schema, a table of another kind); the message names the table and, where one is at
    fault, the column."""


class UpdateValidationError(TickwireError, AssertionError):
    """A TableUpdate that breaks the update model's rules (`TableUpdate.validate`): a defect of the
    table that produced it."""

    code = "INTERNAL"
