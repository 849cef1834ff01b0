"""tickwire.server.adapters: what feeds the engine from elsewhere: replication from other Barrage
servers (`replica`), the in-process Spark sinks (`spark`) and the demo tables (`demo`)."""
