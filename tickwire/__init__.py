"""tickwire: a Barrage-compatible Apache Arrow Flight server for live tables."""

__version__ = "0.1.0"
