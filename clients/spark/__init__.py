"""tickwire.clients.spark: the side of Spark that runs away from the server: the
`writeStream.format("tickwire")` data source (`datasource`, a Flight client that runs in Spark's
driver and workers) and the mapping of Spark's column types to Arrow (`types`), which the
in-process sinks (tickwire.server.adapters.spark) share."""
