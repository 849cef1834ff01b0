"""tickwire.server.engine.storage: durable tables. `Durability` (the fsync policy and checkpoint interval),
`Storage` (an engine's data directory: journals, checkpoints, recovery; `Engine.open_storage`), and
the journal's record format (`journal`)."""
from tickwire.server.engine.storage.journal import JournalCorrupt, Record, ScanResult, decode_data, encode_record, scan
from tickwire.server.engine.storage.store import Durability, Storage, StorageError

__all__ = ["Durability", "Storage", "StorageError", "JournalCorrupt", "Record", "ScanResult", "decode_data",
           "encode_record", "scan"]
