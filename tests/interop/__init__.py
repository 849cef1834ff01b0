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
