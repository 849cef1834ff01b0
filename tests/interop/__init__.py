"""Helpers for tests that drive Deephaven's own clients (and a real Deephaven) against tickwire."""


def close_dh_session(session) -> None:
    """Closes a pydeephaven Session, also when its server is gone.

    `Session.close()` sends CloseSession first and raises when that fails (the server was stopped
    or killed), leaving the session marked connected: its keep-alive thread then goes on refreshing
    its token and, minutes later, raises "Failed to refresh token 3 times" in whatever test is
    running. Marked closed, the keep-alive stops at its next turn."""
    try:
        session.close()
    except Exception:  # noqa: BLE001 - the server it talked to is gone
        session.is_connected = False
        if session.grpc_channel is not None:
            session.grpc_channel.close()


def told_by_both(dh_port: int, story, interval_ms: float = 50) -> tuple:
    """(Deephaven's, tickwire's) answers of `story(port)`, run against the Deephaven on `dh_port`
    and against a fresh tickwire server (stopped afterwards)."""
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    engine = Engine(interval_ms=interval_ms)
    server = TickwireServer(engine, port=0).start()
    try:
        return story(dh_port), story(server.port)
    finally:
        server.stop()
        engine.stop()


class Beside:
    """A tickwire server with static tables, beside a running Deephaven, and a pydeephaven session on
    each: `dh` and `tw` (sessions), `engine`, and `pair(name)`, the same table opened on both (uploaded
    to Deephaven, named on tickwire). Used as a context manager, it closes everything it opened."""

    def __init__(self, dh_port: int, tables: dict, interval_ms: float = 50):
        from pydeephaven import Session

        from tickwire.server.app import TickwireServer
        from tickwire.server.engine import Engine, TableSpec

        self.tables = dict(tables)
        self.engine = Engine(interval_ms=interval_ms)
        for name, data in self.tables.items():
            self.engine.create(TableSpec(name, "static", data=data))
        self.server = TickwireServer(self.engine, port=0).start()
        self.dh = Session(host="127.0.0.1", port=dh_port)
        self.tw = Session(host="127.0.0.1", port=self.server.port)

    def pair(self, name: str):
        """(Deephaven's table, tickwire's table) of the same data."""
        return self.dh.import_table(self.tables[name]), self.tw.open_table(name)

    def __enter__(self) -> "Beside":
        return self

    def __exit__(self, *exc) -> None:
        close_dh_session(self.dh)
        close_dh_session(self.tw)
        self.server.stop()
        self.engine.stop()
