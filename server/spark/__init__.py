"""tickwire.server.spark: Spark Structured Streaming into tickwire tables.

`sink(server_or_graph, table, mode=...)` is a `foreachBatch` function that turns each micro-batch
into one update of a tickwire table, exactly once (see `sinks`); `spark_session(...)` builds a
local SparkSession suited to it (see `session`); `types` maps Spark's column types. pyspark is
imported only when a session is built or a batch arrives.
"""
from tickwire.server.spark.launch import compile_filesystem, spark_conf, spark_session
from tickwire.server.spark.sinks import MODES, TickwireSink, collect_arrow, diff_by_key, fan_out, last_per_key, sink
from tickwire.server.spark.types import SparkSinkError, arrow_schema_for_spark, arrow_type_for_spark

__all__ = ["sink", "fan_out", "TickwireSink", "MODES", "SparkSinkError", "spark_session", "spark_conf",
           "compile_filesystem", "collect_arrow", "arrow_schema_for_spark", "arrow_type_for_spark", "diff_by_key",
           "last_per_key"]
