"""BrowserFlightService's OpenDoPut / NextDoPut, in process: one DoPut cut into one call per
FlightData, as Deephaven's JS API sends uploads (`connection.newTable`, a rollup's key tables).
The calls may arrive in any order; the upload is the same as a DoPut's."""
from __future__ import annotations

import grpc
import pyarrow as pa
import pytest

from tests.harness import Services
from tickwire.protocol.opening import put_batches, put_opening
from tickwire.protocol.proto import flight_pb2
from tickwire.server.services.browser_flight_service import (
    BROWSER_FLIGHT_SERVICE,
    HALF_CLOSE_HEADER,
    SEQUENCE_HEADER,
    TICKET_HEADER,
)

OPEN = f"/{BROWSER_FLIGHT_SERVICE}/OpenDoPut"
NEXT = f"/{BROWSER_FLIGHT_SERVICE}/NextDoPut"
DATA = pa.table({"Sym": ["a", None, "c"], "Qty": pa.array([1, 2, None], pa.int32())})


def _messages(export_id: int) -> list[bytes]:
    """The DoPut of DATA in two batches: the opening (descriptor and schema), then each batch."""
    return put_opening(["export", str(export_id)], DATA.schema) + put_batches(DATA, batch_size=2)


def _md(token: str, ticket: int, seq: int, half: bool = False) -> tuple:
    md = (("authorization", f"Bearer {token}"), (TICKET_HEADER, str(ticket)), (SEQUENCE_HEADER, str(seq)))
    return md + (((HALF_CLOSE_HEADER, "true"),) if half else ())


def _upload(s: Services, token: str, export_id: int, order: list[int], ticket: int = 7):
    """Sends the DoPut of DATA to ['export', export_id] as the JS API does, the NextDoPut calls in
    `order` (indices into the messages after the first; the half-close last of its list's place);
    returns the PutResults of OpenDoPut."""
    msgs = _messages(export_id)
    ch = s.channel()
    opened = s.background(lambda: list(ch.unary_stream(OPEN)(msgs[0], metadata=_md(token, ticket, 0))))
    nxt = ch.unary_unary(NEXT)
    rest = list(range(1, len(msgs))) + [len(msgs)]  # the last is the half-close
    for i in [rest[j] for j in order]:
        payload = msgs[i] if i < len(msgs) else b""
        assert nxt(payload, metadata=_md(token, ticket, i, half=i == len(msgs))) == b""
    return [flight_pb2.PutResult.FromString(r) for r in opened.result(timeout=30)]


@pytest.mark.parametrize("order", [[0, 1, 2], [2, 1, 0], [1, 2, 0]])
def test_an_upload_in_any_order_reads_back(order):
    with Services() as s:
        token = s.new_session()
        assert len(_messages(3)) == 3  # the opening, two batches: two NextDoPut and the half-close
        results = _upload(s, token, 3, order)
        assert results  # acknowledged as DoPut acknowledges
        s.cycle()
        assert s.doget(b"e\x03\x00\x00\x00", token=token).combine_chunks() == DATA


def test_a_sequence_number_used_twice_is_refused():
    with Services() as s:
        token = s.new_session()
        msgs = _messages(4)
        ch = s.channel()
        opened = s.background(lambda: list(ch.unary_stream(OPEN)(msgs[0], metadata=_md(token, 9, 0))))
        nxt = ch.unary_unary(NEXT)
        nxt(msgs[1], metadata=_md(token, 9, 1))
        with pytest.raises(grpc.RpcError) as err:
            nxt(msgs[1], metadata=_md(token, 9, 1))
        assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
        nxt(msgs[2], metadata=_md(token, 9, 2))
        nxt(b"", metadata=_md(token, 9, 3, half=True))
        with pytest.raises(grpc.RpcError) as err:  # after the half-close
            nxt(msgs[2], metadata=_md(token, 9, 4))
        assert err.value.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.OUT_OF_RANGE)
        opened.result(timeout=30)
        with pytest.raises(grpc.RpcError) as err:  # after the stream has ended
            nxt(msgs[2], metadata=_md(token, 9, 5))
        assert err.value.code() == grpc.StatusCode.ABORTED
        with pytest.raises(grpc.RpcError) as err:  # no stream headers
            ch.unary_unary(NEXT)(b"", metadata=(("authorization", f"Bearer {token}"),))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
