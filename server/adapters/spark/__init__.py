"""tickwire.server.adapters.spark: Spark Structured Streaming into tickwire tables.

`sink(engine_or_server, table, mode=...)` is a `foreachBatch` function that turns each micro-batch
into one update of a tickwire table, exactly once (see `sinks`); `spark_session(...)` builds a
local SparkSession suited to it (see `launch`); Spark's column types are mapped by
`tickwire.clients.spark.types`, and `writeStream.format("tickwire")` for queries in other
processes is `tickwire.clients.spark.datasource`. pyspark is imported only when a session is
built or a batch arrives; the names below are imported when first used.
"""
from __future__ import annotations

import importlib

__all__ = ["sink", "fan_out", "TickwireSink", "MODES", "SparkSinkError", "spark_session", "spark_conf",
           "compile_filesystem", "collect_arrow", "arrow_schema_for_spark", "arrow_type_for_spark", "diff_by_key",
           "last_per_key"]

_WHERE = {
    "compile_filesystem": "launch", "spark_conf": "launch", "spark_session": "launch",
    "MODES": "sinks", "TickwireSink": "sinks", "collect_arrow": "sinks", "diff_by_key": "sinks", "fan_out": "sinks",
    "last_per_key": "sinks", "sink": "sinks",
    "SparkSinkError": "types", "arrow_schema_for_spark": "types", "arrow_type_for_spark": "types",
}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    where = "tickwire.clients.spark.types" if module == "types" else f"{__name__}.{module}"
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
