"""tickwire.server.storage: durable tables (the intraday journal's record format so far)."""
from tickwire.server.storage.journal import JournalCorrupt, Record, ScanResult, decode_data, encode_record, scan

__all__ = ["JournalCorrupt", "Record", "ScanResult", "decode_data", "encode_record", "scan"]
