"""Logging for the command line: `--log-level` and `--log-format text|json`.

Lifecycle events are logged with ids as `extra` fields (`session`, `peer`, `auth`, `subscription`,
`table`, `view`, `outcome`, ...): the text format shows them in the message, the JSON format
also as keys of the line's object:

    {"time": "2024-05-01T12:00:00.123+00:00", "level": "INFO", "logger": "tickwire.server.services.sessions",
     "message": "session 3 opened: auth psk, peer ipv4:127.0.0.1:50312", "session": 3, "auth": "psk", ...}
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
from typing import Optional, TextIO

__all__ = ["configure", "JsonFormatter", "TEXT_FORMAT", "extras"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: a LogRecord's own attributes: everything else on a record came from `extra=`
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def extras(record: logging.LogRecord) -> dict:
    """The `extra=` fields of a record."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _jsonable(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (ISO 8601, UTC), level, logger, message, the record's extra
    fields, and `exception` (its traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": _dt.datetime.fromtimestamp(record.created, _dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for k, v in extras(record).items():
            out.setdefault(k, _jsonable(v))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False)


_HANDLER_MARK = "_tickwire_cli_handler"


def configure(level: str = "info", fmt: str = "text", stream: Optional[TextIO] = None) -> logging.Handler:
    """Sends the root logger's records at `level` and above to `stream` (stderr) as `fmt` lines;
    replaces the handler an earlier call installed. Returns the handler."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, _HANDLER_MARK, False):
            root.removeHandler(h)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    setattr(handler, _HANDLER_MARK, True)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    if level != "debug":
        # libraries' chatter stays out of an operator's log unless asked for
        for noisy in ("py4j", "asyncio", "urllib3"):
            logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
    return handler

