"""Seeded, time-bounded fuzzing of the server's whole gRPC request surface.

Every method of every service the server answers (the method table plus the TableService methods
tickwire leaves unimplemented) gets request bodies that are random bytes, truncated or bit-flipped
protobufs, and valid protobufs with hostile values (huge and negative integers, unknown enum
values, empty, foreign and garbage tickets, very long strings). DoExchange and DoPut get FlightData
streams whose app_metadata is a Barrage request (huge viewports, malformed column bitsets, wrong
message types, flipped bits) and whose data_header/data_body are mutated Arrow IPC messages. Calls
go with and without credentials, to an anonymous server and to one that requires a pre-shared key.

Every answer must be a documented status (never UNKNOWN or INTERNAL) with a short printable
detail, within a per-call bound; calls without valid credentials must be refused with
UNAUTHENTICATED before the body is looked at. Meanwhile a subscriber follows two ticking tables,
and at checkpoints (and at the end) it must equal a DoGet of the same table: the server kept
serving others while being fuzzed.

Budget: TICKWIRE_FUZZ_SECONDS (default 40 in `make test`, 100 times TICKWIRE_SOAK under
`make soak`). TICKWIRE_FUZZ_SEED fixes the seed (printed by every run). Each iteration's
requests come from its own generator seeded by (seed, iteration), so TICKWIRE_FUZZ_SEED=s
TICKWIRE_FUZZ_ITER=i replays iteration i alone.
TICKWIRE_FUZZ_SKIP (comma separated mutation kinds, e.g. `huge-viewport`) leaves kinds out while
another failure is being investigated.
"""
from __future__ import annotations

import os
import random
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import grpc
import numpy as np
import pyarrow as pa
import pytest
from google.protobuf.descriptor import FieldDescriptor

import flatbuffers
from tests.convergence import soak_factor
from tickwire.clients.client import BarrageClient
from tickwire.protocol import barrage
from tickwire.protocol import rowset as rs
from tickwire.protocol.fb.barrage import BarrageSnapshotRequest as FbSnapReq
from tickwire.protocol.fb.barrage import BarrageSubscriptionRequest as FbSubReq
from tickwire.protocol.flight import DESCRIPTOR_CMD, DESCRIPTOR_PATH, FlightDescriptor, encode_flight_data
from tickwire.protocol.proto import config_pb2, flight_pb2, table_pb2
from tickwire.protocol.proto.methods import (
    ALL_METHODS,
    CLIENT_STREAM,
    METHODS,
    SERVER_STREAM,
    UNARY,
)
from tickwire.protocol.tickets import export_ticket
from tickwire.server.adapters.demo import TRADES, DemoTicker
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.services import KEYS_METADATA
from tickwire.server.services.rpc import UNAUTHENTICATED_METHODS
from tickwire.server.services.sessions import PSK_SCHEME

pytestmark = pytest.mark.slow

SC = grpc.StatusCode
ALLOWED = {SC.OK, SC.INVALID_ARGUMENT, SC.NOT_FOUND, SC.UNAUTHENTICATED, SC.UNIMPLEMENTED, SC.FAILED_PRECONDITION,
           SC.ALREADY_EXISTS, SC.RESOURCE_EXHAUSTED, SC.PERMISSION_DENIED}
# s: a call must end or send its first response within this. Answers take milliseconds; the bound is
# for thousands of calls on a loaded machine, where a GC pass or a stalled CPU can hold one up for
# seconds, while a server that hangs or does unbounded work on a hostile body still exceeds it.
CALL_TIMEOUT = 30.0
HOLD = 0.2  # s: how long a call that stays open (a live subscription) is read before the test cancels it
# calls the server holds open without answering while nothing happens (as Deephaven does): a session's
# TerminationNotification, and ExportedTableUpdates of a session without exports. With credentials that
# may be valid they are read for HELD_WAIT (staying open is the expected answer); without valid ones
# they must be refused (UNAUTHENTICATED) within CALL_TIMEOUT like any other call
HELD_OPEN = {"/io.deephaven.proto.backplane.grpc.SessionService/TerminationNotification",
             "/io.deephaven.proto.backplane.grpc.TableService/ExportedTableUpdates"}
HELD_WAIT = 1.0
# s: how long a call naming an export its session has not made waits for it (ServerConfig.export_wait_s);
# fuzzed tickets name ids nobody makes, and each such call answers NOT_FOUND after this, well within CALL_TIMEOUT
EXPORT_WAIT = 0.5
MAX_DETAIL = 1000
PSK = "fuzz-s3cret"
CONFIG_PATH = "/io.deephaven.proto.backplane.grpc.ConfigService/GetConfigurationConstants"
FETCH_PATH = "/io.deephaven.proto.backplane.grpc.TableService/FetchTable"
CLOSE_PATH = "/io.deephaven.proto.backplane.grpc.SessionService/CloseSession"
DOGET_PATH = "/arrow.flight.protocol.FlightService/DoGet"
DOPUT_PATH = "/arrow.flight.protocol.FlightService/DoPut"
DOEXCHANGE_PATH = "/arrow.flight.protocol.FlightService/DoExchange"

# every method the .proto files define: the server registers a handler for most of them (see
# `registered`); the others are answered UNIMPLEMENTED by gRPC itself. The FlightData streams get
# the most calls, the methods tickwire leaves unimplemented the fewest.
FUZZED = sorted(ALL_METHODS)
WEIGHTS = [10.0 if p in (DOEXCHANGE_PATH, DOPUT_PATH) else 1.0 if p in METHODS else 0.2 for p in FUZZED]

INT_EDGES = [0, 1, -1, 2, 3, 7, 100, 2**31 - 1, -2**31, 2**32 - 1, 2**62, 2**63 - 1, -2**63, 2**64 - 1, 10**9]
FLOAT_EDGES = [0.0, -0.0, 1.5, -1.0, float("nan"), float("inf"), float("-inf"), 1e308, 5e-324]
STRINGS = ["", "Sym", "Price", "Size", "Seq", "Timestamp", "Nope", "scope", "export", "ticking_keyed", "list-tables",
           "Price > 100", "Sym = `SYM01`", "Price >", "((((", "Size + 1", "X = Price * 2", "X = ", "=", "Price in 1, 2",
           "Size / 0", "Seq = Seq + 9223372036854775807", "__import__('os').system('true')", "Timestamp > '2020'",
           "Price = Price", "Sym.length() > 2", "!", "`", "'", "\\", "\x00", "é∂ƒ©˙∆", "\u202e\u0007bell",
           "Sym = 'x' && Price > 1 || Size < 2", "X = Y = Z"]
NAMES = ["ticking_keyed", "ticking_append", "blink", "ticking_ring", "ticking_sorted", "static_mixed", "nope", "fuzz_0",
         "fuzz_1", "fuzz_2", ""]
PATHS = [["scope", n] for n in NAMES] + [
    ["export", "5"], ["export", "1"], ["export", "7"], ["export", "-1"], ["export", "0"], ["export", "99999999999"],
    ["export", "x"], ["scope"], [], ["x"], ["scope", "a" * 5000], ["app", "a", "field", "b"], ["shared", "zz"],
    ["shared", "00ff"], ["scope", "fuzz_0", "extra"], ["scope", "\x00"]]
SMALL = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])
ODD = pa.schema([("x", pa.bool_()), ("y", pa.list_(pa.int32())), ("z", pa.binary()), ("d", pa.date32()),
                 ("t", pa.timestamp("ms")), ("u", pa.uint16())])


def plain(t: pa.Table) -> pa.Table:
    return pa.table({f.name: t.column(i) for i, f in enumerate(t.schema)})


# -- byte-level mutations ------------------------------------------------------------------------------------

def random_bytes(rng: random.Random, big: bool = False) -> bytes:
    n = rng.choice([0, 1, 2, 5, 16, 64, 300, 2000]) if not big else rng.choice([10_000, 200_000])
    return rng.randbytes(n)


def mutate_bytes(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """(kind, bytes): `data` unchanged, truncated, bit-flipped, spliced or extended."""
    kind = rng.choice(["keep", "keep", "truncate", "bitflip", "bitflip", "splice", "append", "zero-run"])
    b = bytearray(data)
    if kind == "truncate" and b:
        del b[rng.randrange(len(b)):]
    elif kind == "bitflip" and b:
        for _ in range(rng.choice([1, 1, 2, 8])):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == "splice":
        at = rng.randrange(len(b) + 1)
        b[at:at] = rng.randbytes(rng.choice([1, 4, 9, 40]))
    elif kind == "append":
        b += rng.randbytes(rng.choice([1, 3, 30]))
    elif kind == "zero-run" and b:
        at = rng.randrange(len(b))
        b[at:at + rng.choice([1, 4, 8])] = bytes(len(b[at:at + 4]))
    else:
        kind = "keep"
    return kind, bytes(b)


# -- hostile protobuf messages -----------------------------------------------------------------------------

class Pools:
    """Values for hostile but meaningful fields: tickets of this and other sessions, names, paths."""

    def __init__(self):
        self.own_exports = [1, 2, 3]  # held by session A (FetchTable at setup)
        self.other_exports = [7, 8]  # held by session B

    def ticket(self, rng: random.Random) -> bytes:
        r = rng.random()
        if r < 0.35:
            return b"s/" + rng.choice(NAMES).encode()
        if r < 0.55:
            return export_ticket(rng.choice(self.own_exports + self.other_exports + [5, 9, -1, 2**31 - 1, -2**31]))
        return rng.choice([b"", b"s", b"s/", b"e", b"e\x00\x00\x00\x00", b"e\x01\x00\x00", b"e\x01\x00\x00\x00\x00",
                           b"a/x/f/y", b"a/", b"h", b"h" + rng.randbytes(8), b"s/\xff\xfe", b"s/" + b"x" * 10_000,
                           b"\x00" * 3, rng.randbytes(rng.choice([1, 5, 40])), b"z/whatever"])

    @staticmethod
    def string(rng: random.Random) -> str:
        r = rng.random()
        if r < 0.8:
            return rng.choice(STRINGS)
        if r < 0.9:
            return rng.choice(["a", "Price", "(", "é"]) * rng.choice([1000, 100_000])
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0xA0, 0xD7FF)]))
                       for _ in range(rng.randrange(1, 30)))


_INT_BOUNDS = {
    FieldDescriptor.TYPE_INT32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_SINT32: (-2**31, 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-2**31, 2**31 - 1), FieldDescriptor.TYPE_INT64: (-2**63, 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-2**63, 2**63 - 1), FieldDescriptor.TYPE_SFIXED64: (-2**63, 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1), FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1), FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def scalar_value(rng: random.Random, f, pools: Pools):
    t = f.type
    if t in _INT_BOUNDS:
        lo, hi = _INT_BOUNDS[t]
        v = rng.choice(INT_EDGES) if rng.random() < 0.8 else rng.randint(lo, hi)
        return min(max(v, lo), hi)
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in f.enum_type.values]
        return rng.choice(known) if rng.random() < 0.6 else rng.choice([99, -1, -2**31, 2**31 - 1, max(known) + 1])
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rng.choice(FLOAT_EDGES)
    if t == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if t == FieldDescriptor.TYPE_BYTES:
        return pools.ticket(rng) if "ticket" in f.name or rng.random() < 0.5 else random_bytes(rng)
    if t == FieldDescriptor.TYPE_STRING:
        return pools.string(rng)
    raise AssertionError(f"no generator for field {f.full_name} of type {t}")


def fill(msg, rng: random.Random, pools: Pools, depth: int = 0) -> None:
    """Sets a random selection of `msg`'s fields to hostile values (one member per oneof)."""
    d = msg.DESCRIPTOR
    chosen = {o.full_name: rng.choice(list(o.fields) + [None]) for o in d.oneofs}
    for f in d.fields:
        if f.containing_oneof is not None:
            if chosen[f.containing_oneof.full_name] is not f:
                continue
        elif rng.random() < 0.3:
            continue
        if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            entries = getattr(msg, f.name)
            value_f = f.message_type.fields_by_name["value"]
            for _ in range(rng.choice([0, 1, 3])):
                key = scalar_value(rng, f.message_type.fields_by_name["key"], pools)
                if value_f.type == FieldDescriptor.TYPE_MESSAGE:
                    fill(entries[key], rng, pools, depth + 1)
                else:
                    entries[key] = scalar_value(rng, value_f, pools)
            continue
        if f.name == "path" and f.is_repeated and f.type == FieldDescriptor.TYPE_STRING:
            getattr(msg, f.name).extend(rng.choice(PATHS))
            continue
        if f.is_repeated:
            n = rng.choice([0, 1, 1, 2, 3, 40]) if depth < 3 else rng.choice([0, 1])
            items = getattr(msg, f.name)
            for _ in range(n):
                if f.type == FieldDescriptor.TYPE_MESSAGE:
                    fill(items.add(), rng, pools, depth + 1)
                else:
                    _append(items, rng, f, pools)
        elif f.type == FieldDescriptor.TYPE_MESSAGE:
            if depth < 5:
                sub = getattr(msg, f.name)
                sub.SetInParent()
                fill(sub, rng, pools, depth + 1)
        else:
            _set(msg, rng, f, pools)


def _set(msg, rng, f, pools) -> None:
    try:
        setattr(msg, f.name, scalar_value(rng, f, pools))
    except ValueError:  # a closed enum refuses unknown values
        setattr(msg, f.name, f.enum_type.values[0].number)


def _append(items, rng, f, pools) -> None:
    try:
        items.append(scalar_value(rng, f, pools))
    except ValueError:
        items.append(f.enum_type.values[0].number)


def protobuf_body(rng: random.Random, cls, pools: Pools) -> tuple[str, bytes]:
    """(mutation kind, bytes) of one request message."""
    r = rng.random()
    if r < 0.12:
        return "random-bytes", random_bytes(rng, big=rng.random() < 0.05)
    if r < 0.17:
        return "empty", b""
    msg = cls()
    fill(msg, rng, pools)
    data = msg.SerializeToString()
    kind, data = mutate_bytes(rng, data) if rng.random() < 0.4 else ("keep", data)
    return ("hostile-protobuf" if kind == "keep" else f"protobuf-{kind}"), data


# -- Barrage requests and Arrow messages -------------------------------------------------------------------------

VIEWPORTS = {
    "small": [[0, 5]],
    "tail": [[0, 2], [10, 12]],
    "huge-viewport": [[0, 0], [2, 2**40]],
    "huge-viewport-62": [[0, 2**62]],
    "huge-viewport-max": [[2**62, 2**63 - 2]],
    "many-ranges": [[i * 3, i * 3 + 1] for i in range(2000)],
}


def barrage_request(rng: random.Random, pools: Pools, skip: set[str]) -> tuple[list[str], bytes]:
    """(mutation kinds, app_metadata bytes): a subscription or snapshot request, mutated."""
    kinds: list[str] = []
    snapshot = rng.random() < 0.35
    kinds.append("snapshot-request" if snapshot else "subscription-request")
    ticket = b"s/ticking_keyed" if rng.random() < 0.4 else pools.ticket(rng)
    cols: Optional[bytes] = None
    r = rng.random()
    if r < 0.25:
        cols = rs.encode_bitset(sorted(rng.sample(range(6), rng.randrange(0, 6))))
    elif r < 0.4:
        kinds.append("huge-columns")
        cols = rs.encode_bitset([rng.choice([5, 6, 64, 10**4, 10**6])])
    elif r < 0.5:
        kinds.append("malformed-columns")
        cols = rng.choice([b"\xff" * rng.choice([1, 8, 1000, 100_000]), b"", b"\x00" * 64, rng.randbytes(20)])
    vp: Optional[bytes] = None
    r = rng.random()
    if r < 0.45:
        names = [n for n in VIEWPORTS if n not in skip and not ("huge-viewport" in skip and n.startswith("huge"))]
        name = rng.choice(names)
        if name.startswith("huge"):
            kinds.append("huge-viewport")
        vp = rs.encode_rowset(np.array(VIEWPORTS[name], dtype=np.int64))
    elif r < 0.55:
        kinds.append("malformed-viewport")
        vp = rng.choice([b"", b"\x20", b"\x08", rng.randbytes(12), b"\x0b" + rng.randbytes(8) + b"\x20",
                         b"\x13\xff\xff\xff\x7f" + b"\x01" * 30 + b"\x20"])
    if rng.random() < 0.5:
        ints32 = [0, 1, -1, 7, 2**31 - 1, -2**31, 64]
        if snapshot:
            opts = barrage.SnapshotOptions(
                column_conversion_mode=rng.choice([0, 1, 2, 127, -128]), use_deephaven_nulls=rng.random() < 0.5,
                batch_size=rng.choice(ints32), max_message_size=rng.choice(ints32),
                preview_list_length_limit=rng.choice([0, -1, 2**63 - 1, 3]))
        else:
            opts = barrage.SubscriptionOptions(
                column_conversion_mode=rng.choice([0, 1, 2, 127, -128]), use_deephaven_nulls=rng.random() < 0.5,
                min_update_interval_ms=rng.choice(ints32), batch_size=rng.choice(ints32),
                max_message_size=rng.choice(ints32), columns_as_list=rng.random() < 0.3,
                preview_list_length_limit=rng.choice([0, -1, 2**63 - 1, 3]))
        kinds.append("hostile-options")
    else:
        opts = None
    payload = _raw_request(FbSnapReq if snapshot else FbSubReq, ticket, cols, vp, opts, rng.random() < 0.2,
                           token=None if snapshot or rng.random() < 0.9 else rng.randbytes(8))
    msg_type = int(barrage.BarrageMessageType.SNAPSHOT_REQUEST if snapshot else
                   barrage.BarrageMessageType.SUBSCRIPTION_REQUEST)
    if rng.random() < 0.1:
        kinds.append("wrong-message-type")
        msg_type = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 127, 255, -1])
    magic = barrage.MAGIC
    if rng.random() < 0.05:
        kinds.append("wrong-magic")
        magic = rng.choice([0, 1, 0xFFFFFFFF, barrage.MAGIC ^ 1])
    if rng.random() < 0.15:
        k, payload = mutate_bytes(rng, payload)
        kinds.append(f"payload-{k}")
    data = barrage.BarrageMessageWrapper(msg_type=msg_type, payload=payload, magic=magic).to_bytes()
    if rng.random() < 0.1:
        k, data = mutate_bytes(rng, data)
        kinds.append(f"wrapper-{k}")
    if rng.random() < 0.04:
        kinds.append("metadata-random-bytes")
        data = random_bytes(rng)
    return kinds, data


def _raw_request(fb, ticket, cols, vp, opts, reverse: bool, token=None) -> bytes:
    """A subscription or snapshot request whose vectors are given as raw bytes (malformed ones too)."""
    b = flatbuffers.Builder(64)
    c = b.CreateByteVector(cols) if cols is not None else 0
    v = b.CreateByteVector(vp) if vp is not None else 0
    o = opts.build_into(b) if opts is not None else 0
    t = b.CreateByteVector(ticket) if ticket is not None else 0
    k = b.CreateByteVector(token) if token is not None else 0
    fb.Start(b)
    if c:
        fb.AddColumns(b, c)
    if v:
        fb.AddViewport(b, v)
    if o:
        (fb.AddSnapshotOptions if fb is FbSnapReq else fb.AddSubscriptionOptions)(b, o)
    if t:
        fb.AddTicket(b, t)
    fb.AddReverseViewport(b, reverse)
    if k:
        fb.AddSubscriptionToken(b, k)
    b.Finish(fb.End(b))
    return bytes(b.Output())


def random_rows(rng: random.Random, schema: pa.Schema, n: int) -> pa.RecordBatch:
    g = np.random.default_rng(rng.randrange(2**32))
    cols = []
    for f in schema:
        t = f.type
        if pa.types.is_timestamp(t):  # sometimes beyond what nanoseconds can hold
            top = 2**62 if rng.random() < 0.1 else 2**40
            cols.append(pa.array(g.integers(-top // 4, top, n)).cast(pa.int64()).view(t))
        elif pa.types.is_string(t):
            cols.append(pa.array([f"SYM{x:02d}" for x in g.integers(0, 25, n).tolist()], t))
        elif pa.types.is_floating(t):
            cols.append(pa.array(g.normal(100, 5, n), t))
        elif pa.types.is_integer(t):
            cols.append(pa.array(g.integers(0, 1000, n), t))
        elif pa.types.is_boolean(t):
            cols.append(pa.array(g.random(n) < 0.5, t))
        elif pa.types.is_list(t):
            cols.append(pa.array([list(range(int(x))) for x in g.integers(0, 4, n)], t))
        elif pa.types.is_binary(t):
            cols.append(pa.array([bytes([int(x)]) * 3 for x in g.integers(0, 255, n)], t))
        elif pa.types.is_date(t):
            cols.append(pa.array(g.integers(0, 20000, n).astype(np.int32), pa.int32()).view(t))
        else:
            raise AssertionError(f"no generator for {t}")
    return pa.record_batch(cols, schema=schema)


def ipc_messages(schema: pa.Schema, batches: list[pa.RecordBatch]) -> list[tuple[bytes, bytes]]:
    """(data_header, data_body) of each Arrow IPC message of a stream: the schema, then the batches."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as w:
        for b in batches:
            w.write_batch(b)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    out = []
    while True:
        try:
            m = reader.read_next_message()
        except StopIteration:
            return out
        out.append((m.metadata.to_pybytes(), b"" if m.body is None else m.body.to_pybytes()))


def arrow_stream(rng: random.Random, kinds: list[str]) -> list[tuple[bytes, bytes]]:
    schema = rng.choice([TRADES, TRADES, SMALL, ODD])
    if rng.random() < 0.3:
        keys = rng.choice([b"Sym", b"a", b"nope", b"", b",,", b"Sym,Sym", b"x", b"S\xffm", b"\xc3"])
        schema = schema.with_metadata({KEYS_METADATA: keys})
        kinds.append("keys-metadata")
    batches = [random_rows(rng, schema, rng.choice([0, 1, 5, 50])) for _ in range(rng.choice([0, 1, 2]))]
    msgs = ipc_messages(schema, batches)
    if rng.random() < 0.05:  # a field name that is not UTF-8 (the schema is otherwise intact)
        kinds.append("arrow-non-utf8-name")
        name = rng.choice(schema.names).encode()
        msgs[0] = (msgs[0][0].replace(name, b"\xff" + name[1:], 1), msgs[0][1])
    r = rng.random()
    if r < 0.35 and msgs:
        i = rng.randrange(len(msgs))
        h, b = msgs[i]
        if rng.random() < 0.6:
            k, h = mutate_bytes(rng, h)
            kinds.append(f"arrow-header-{k}")
        else:
            k, b = mutate_bytes(rng, b)
            kinds.append(f"arrow-body-{k}")
        msgs[i] = (h, b)
    elif r < 0.45 and len(msgs) > 1:
        kinds.append("arrow-reordered")
        rng.shuffle(msgs)
    elif r < 0.5 and msgs:
        kinds.append("arrow-schema-twice")
        msgs.insert(1, msgs[0])
    elif r < 0.55 and len(msgs) > 1:
        kinds.append("arrow-body-swapped")
        msgs[-1] = (msgs[-1][0], rng.randbytes(len(msgs[-1][1]) or 8))
    return msgs


def do_put_stream(rng: random.Random, pools: Pools) -> tuple[list[str], list[bytes]]:
    kinds = ["doput"]
    path = rng.choice(PATHS)
    desc_type = DESCRIPTOR_PATH if rng.random() < 0.9 else rng.choice([DESCRIPTOR_CMD, 0, 7])
    desc = FlightDescriptor(desc_type, b"cmd" if desc_type == DESCRIPTOR_CMD else b"", list(path))
    out: list[bytes] = []
    if rng.random() < 0.3:
        kinds.append("doput-options")
        opts = barrage.SubscriptionOptions(use_deephaven_nulls=rng.random() < 0.5, columns_as_list=rng.random() < 0.3)
        md = barrage.wrap(barrage.SubscriptionRequest(options=opts), barrage.BarrageMessageType.SERIALIZATION_OPTIONS)
        if rng.random() < 0.3:
            k, md = mutate_bytes(rng, md)
            kinds.append(f"doput-options-{k}")
        out.append(encode_flight_data(b"", md, descriptor=desc))
    msgs = arrow_stream(rng, kinds)
    for i, (h, b) in enumerate(msgs):
        first = not out and i == 0
        d = desc if first or rng.random() < 0.05 else None
        out.append(encode_flight_data(h, None, b, d, force_body=bool(b)))
    if not out:
        out.append(encode_flight_data(b"", None, None, desc))
    return kinds, out


def do_exchange_stream(rng: random.Random, pools: Pools, skip: set[str]) -> tuple[list[str], list[bytes]]:
    kinds: list[str] = ["doexchange"]
    out: list[bytes] = []
    if rng.random() < 0.2:
        out.append(encode_flight_data(b"", None, descriptor=FlightDescriptor.for_command(b"dphn")))
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        k, md = barrage_request(rng, pools, skip)
        kinds += k
        header, body = b"", None
        if rng.random() < 0.1:
            kinds.append("exchange-arrow-data")
            msgs = arrow_stream(rng, kinds)
            if msgs:
                header, body = msgs[-1]
        out.append(encode_flight_data(header, md, body))
    if rng.random() < 0.05:
        kinds.append("exchange-no-metadata")
        out.append(encode_flight_data(b"", None))
    return kinds, out


def stream_messages(rng: random.Random, method, pools: Pools, skip: set[str]) -> tuple[list[str], list[bytes]]:
    """The request messages of one call of `method`, and the mutation kinds used."""
    if method.path == DOEXCHANGE_PATH and rng.random() < 0.85:
        kinds, msgs = do_exchange_stream(rng, pools, skip)
    elif method.path == DOPUT_PATH and rng.random() < 0.85:
        kinds, msgs = do_put_stream(rng, pools)
    else:
        n = 1 if not method.client_streaming else rng.choice([0, 1, 1, 2, 3])
        kinds, msgs = [], []
        for _ in range(n):
            k, b = protobuf_body(rng, method.request, pools)
            kinds.append(k)
            msgs.append(b)
        return kinds, msgs
    if rng.random() < 0.1:  # then mangle one whole FlightData message
        i = rng.randrange(len(msgs))
        k, msgs[i] = mutate_bytes(rng, msgs[i])
        kinds.append(f"flightdata-{k}")
    return kinds, msgs


# -- running calls ---------------------------------------------------------------------------------------------

@dataclass
class Case:
    iteration: int
    method: str
    target: str  # "main" or "psk"
    creds: str
    valid_creds: Optional[bool]  # None: either a refusal or an answer is right
    metadata: tuple
    messages: list[bytes]
    kinds: list[str]
    keep_open: bool

    def body_hex(self, limit: int = 4000) -> str:
        text = ",".join(m.hex() for m in self.messages)
        return text if len(text) <= limit else f"{text[:limit]}... ({sum(map(len, self.messages))} bytes in all)"


@dataclass
class Outcome:
    code: SC
    details: str
    responses: int
    cancelled_by_test: bool
    seconds: float


def answer_within(case: Case) -> float:
    """How long `case`'s call is given to end or answer: a held-open method with credentials that
    may be valid is only read for HELD_WAIT (it is expected to stay open); every other call, a
    held-open method without valid credentials among them, must end or answer within CALL_TIMEOUT."""
    return HELD_WAIT if case.method in HELD_OPEN and case.valid_creds is not False else CALL_TIMEOUT


def invoke(channel: grpc.Channel, case: Case, metadata) -> Outcome:
    kind = ALL_METHODS[case.method].kind
    t0 = time.monotonic()
    wait = answer_within(case)
    if kind == UNARY:
        fn = channel.unary_unary(case.method, request_serializer=None, response_deserializer=None)
        try:
            fn(case.messages[0], metadata=metadata, timeout=wait)
            return Outcome(SC.OK, "", 1, False, time.monotonic() - t0)
        except grpc.RpcError as exc:
            return Outcome(exc.code(), exc.details() or "", 0, False, time.monotonic() - t0)
    release = threading.Event()
    ours = threading.Event()

    def requests():
        yield from case.messages
        if case.keep_open:
            release.wait(CALL_TIMEOUT + 2)

    if kind == CLIENT_STREAM:
        fn = channel.stream_unary(case.method, request_serializer=None, response_deserializer=None)
        fut = fn.future(requests(), metadata=metadata, timeout=CALL_TIMEOUT)
        timer = threading.Timer(HOLD, lambda: (ours.set(), fut.cancel())) if case.keep_open else None
        if timer:
            timer.start()
        try:
            fut.result()
            return Outcome(SC.OK, "", 1, False, time.monotonic() - t0)
        except grpc.FutureCancelledError:
            return Outcome(SC.CANCELLED, "", 0, ours.is_set(), time.monotonic() - t0)
        except grpc.RpcError as exc:
            return Outcome(exc.code(), exc.details() or "", 0, ours.is_set(), time.monotonic() - t0)
        finally:
            if timer:
                timer.cancel()
            release.set()
    if kind == SERVER_STREAM:
        call = channel.unary_stream(case.method, request_serializer=None, response_deserializer=None)(
            case.messages[0], metadata=metadata, timeout=wait)
    else:
        call = channel.stream_stream(case.method, request_serializer=None, response_deserializer=None)(
            requests(), metadata=metadata, timeout=CALL_TIMEOUT)

    def cancel():
        ours.set()
        call.cancel()

    # a call kept open by the client may legitimately wait for more input: the test ends it after
    # HOLD; any other call must end, or answer, within CALL_TIMEOUT (then it is read for HOLD)
    timer = threading.Timer(HOLD, cancel) if case.keep_open else None
    if timer:
        timer.start()
    n = 0
    try:
        for _ in call:
            n += 1
            if timer is None:
                timer = threading.Timer(HOLD, cancel)
                timer.start()
        return Outcome(SC.OK, "", n, ours.is_set(), time.monotonic() - t0)
    except grpc.RpcError as exc:
        return Outcome(exc.code(), exc.details() or "", n, ours.is_set(), time.monotonic() - t0)
    finally:
        if timer:
            timer.cancel()
        release.set()


def registered(server: TickwireServer) -> set[str]:
    """The method paths `server` has handlers for (they must check credentials first)."""
    return server.method_paths


def problems(case: Case, out: Outcome, handled: set[str]) -> list[str]:
    """What is wrong with this answer (empty when it is acceptable)."""
    found = []
    code = out.code
    if code == SC.CANCELLED and out.cancelled_by_test:
        pass
    elif code == SC.DEADLINE_EXCEEDED and out.responses > 0:
        pass  # it answered in time; a stream that then stays open is the test's to end
    elif code == SC.DEADLINE_EXCEEDED and case.method in HELD_OPEN and case.valid_creds is not False:
        pass  # held open by design while its session lives
    elif code == SC.DEADLINE_EXCEEDED:
        found.append(f"no answer within {answer_within(case):.0f} s")
    elif code == SC.UNAVAILABLE and case.method.endswith("/Release") and out.details == "Export not yet defined":
        pass  # Deephaven's answer to the release of an id its session never named (tests/test_pending_exports.py)
    elif code == SC.CANCELLED and out.details == "Export is cancelled":
        pass  # it named an export whose making call the test cancelled: its dependents hear that (sessions.py)
    elif code not in ALLOWED:
        found.append(f"status {code.name} is not a documented answer")
    if case.valid_creds is False and case.method in handled and case.method not in UNAUTHENTICATED_METHODS \
            and code not in (SC.UNAUTHENTICATED,) \
            and not (code == SC.CANCELLED and out.cancelled_by_test):
        found.append(f"a call without valid credentials answered {code.name}, not UNAUTHENTICATED")
    if len(out.details) >= MAX_DETAIL:
        found.append(f"detail of {len(out.details)} characters")
    if not out.details.isprintable():
        found.append("detail has unprintable characters")
    return found


def failure_class(method: str, out: Outcome, what: str) -> tuple:
    """(problem, status, detail prefix): the same defect seen through different methods is one class."""
    prefix = out.details.replace(method.rsplit("/", 1)[1], "<method>")
    prefix = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27,}", "<ref>", prefix)
    prefix = re.sub(r"'[^']*'|\"[^\"]*\"", "'.'", prefix)  # quoted names and values
    prefix = re.sub(r"\d+", "#", prefix)[:40]
    return what.split(" within")[0].split(" of ")[0][:40], out.code.name, prefix


# -- the servers ----------------------------------------------------------------------------------------------

class Servers:
    def __init__(self, seed: int):
        self.engine = Engine(interval_ms=3_600_000)  # stepped by the ticking thread and the checks
        self.ticker = DemoTicker(self.engine, rows_per_tick=5, seed=seed % 2**32)
        for _ in range(3):
            self.ticker.tick()
            self.engine.run_cycle()
        self.main = TickwireServer(self.engine, port=0, start_engine=False, export_wait_s=EXPORT_WAIT).start()
        psk_engine = Engine(interval_ms=3_600_000)
        psk_engine.create(TableSpec("static_mixed", "static", data=pa.table({"a": pa.array([1, 2, 3], pa.int64())})))
        psk_engine.create(TableSpec("ticking_keyed", "keyed", TRADES, keys=["Sym"]))
        psk_engine.run_cycle()
        self.psk = TickwireServer(psk_engine, port=0, psk=PSK, start_engine=False, export_wait_s=EXPORT_WAIT).start()
        self.channels = {"main": grpc.insecure_channel(self.main.target), "psk": grpc.insecure_channel(self.psk.target)}
        self.bearers: dict[str, str] = {}
        self.tick_lock = threading.Lock()
        self.stop_ticking = threading.Event()
        self.ticker_error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._tick, name="fuzz-ticker", daemon=True)

    def _tick(self):
        try:
            while not self.stop_ticking.wait(0.05):
                with self.tick_lock:
                    self.ticker.tick()
                    self.engine.run_cycle()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.ticker_error = exc

    def session(self, target: str, label: str, exports: list[int]) -> str:
        """A bearer token of a new session on `target`, holding `exports` (FetchTable of ticking_keyed)."""
        ch = self.channels[target]
        m = METHODS[CONFIG_PATH]
        auth = (("authorization", "Anonymous" if target == "main" else f"{PSK_SCHEME} {PSK}"),)
        _r, call = ch.unary_unary(CONFIG_PATH, request_serializer=m.request.SerializeToString,
                                  response_deserializer=m.response.FromString).with_call(
            config_pb2.ConfigurationConstantsRequest(), metadata=auth, timeout=CALL_TIMEOUT)
        bearer = dict(call.initial_metadata())["authorization"]
        f = METHODS[FETCH_PATH]
        fetch = ch.unary_unary(FETCH_PATH, request_serializer=f.request.SerializeToString,
                               response_deserializer=f.response.FromString)
        for e in exports:
            req = table_pb2.FetchTableRequest()
            req.source_id.ticket.ticket = b"s/ticking_keyed"
            req.result_id.ticket = export_ticket(e)
            fetch(req, metadata=(("authorization", bearer),), timeout=CALL_TIMEOUT)
        self.bearers[label] = bearer
        return bearer

    def open_sessions(self):
        self.session("main", "A", [1, 2, 3])
        self.session("main", "B", [7, 8])
        self.session("psk", "P", [1])

    def credentials(self, rng: random.Random, target: str) -> tuple[str, bool, tuple]:
        """(label, valid?, metadata)."""
        if target == "main":
            label = rng.choice(["anonymous", "anonymous", "bearer-A", "bearer-A", "bearer-B", "none", "bad-bearer",
                                "bad-scheme", "basic", "psk-on-anonymous-server"])
        else:
            label = rng.choice(["psk", "psk", "bearer-P", "none", "anonymous", "wrong-psk", "bad-bearer",
                                "bad-scheme", "basic"])
        md = {"anonymous": (("authorization", "Anonymous"),), "none": (),
              "bad-bearer": (("authorization", "Bearer " + rng.randbytes(16).hex()),),
              "bad-scheme": (("authorization",
                              rng.choice(["Negotiate abc", "x" * 2000, "Bearer", "", "Anonymous x"])),),
              "basic": (("authorization", "Basic dXNlcjpwdw=="),),
              "psk": (("authorization", f"{PSK_SCHEME} {PSK}"),),
              "wrong-psk": (("authorization", f"{PSK_SCHEME} {PSK}x"),),
              "psk-on-anonymous-server": (("authorization", f"{PSK_SCHEME} {PSK}"),)}
        if label.startswith("bearer-"):
            return label, True, (("authorization", self.bearers[label[-1]]),)
        if target == "main" and label in ("basic", "psk-on-anonymous-server"):
            return label, None, md[label]  # credentials an anonymous server may accept or refuse
        return label, label == ("anonymous" if target == "main" else "psk"), md[label]

    def alive(self) -> Optional[str]:
        """None when the main server still answers a config call and a DoGet promptly; else why not."""
        ch = self.channels["main"]
        try:
            ch.unary_unary(CONFIG_PATH)(b"", metadata=(("authorization", "Anonymous"),), timeout=CALL_TIMEOUT)
            get = ch.unary_stream(DOGET_PATH)
            list(get(flight_pb2.Ticket(ticket=b"s/static_mixed").SerializeToString(),
                     metadata=(("authorization", "Anonymous"),), timeout=CALL_TIMEOUT))
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {(exc.details() or '')[:200]}"
        return None

    def close(self):
        self.stop_ticking.set()
        self.thread.join(10)
        for ch in self.channels.values():
            ch.close()
        self.main.stop()
        self.psk.stop()


def converged(servers: Servers, client: BarrageClient, subs: dict, timeout: float = 20.0) -> Optional[str]:
    """Pauses the ticking, then checks that each subscription reached the engine's step and equals
    a DoGet of its table; None when all did, else what differed."""
    if not servers.tick_lock.acquire(timeout=timeout):
        return "the ticking thread did not finish its cycle (the engine is stuck)"
    try:
        servers.ticker.tick()  # every subscribed table changes in this cycle
        servers.engine.run_cycle()
        step = servers.engine.step
        for name, sub in subs.items():
            if sub.closed or sub.error is not None:
                return f"the subscription to {name} ended: {sub.error}"
            if not sub.wait_for(lambda s: s.last_seq >= step, timeout):
                return f"the subscription to {name} did not reach step {step} (at {sub.last_seq})"
            got = plain(sub.table)
            want = plain(client.snapshot(name, timeout=timeout))
            if not got.equals(want):
                return f"the subscription to {name} ({got.num_rows} rows) differs from DoGet ({want.num_rows} rows)"
    finally:
        servers.tick_lock.release()
    return None


# -- the test ---------------------------------------------------------------------------------------------------

@dataclass
class Failure:
    case: Case  # the call with the smallest body
    outcome: Outcome
    what: str
    count: int = 1
    iterations: list[int] = field(default_factory=list)
    methods: Counter = field(default_factory=Counter)


def make_case(seed: int, i: int, servers: Servers, pools: Pools, skip: set[str]) -> Case:
    rng = random.Random(f"{seed}:{i}")
    method = ALL_METHODS[rng.choices(FUZZED, WEIGHTS)[0]]
    target = "psk" if rng.random() < 0.15 else "main"
    creds, valid, md = servers.credentials(rng, target)
    kinds, msgs = stream_messages(rng, method, pools, skip)
    keep_open = method.client_streaming and rng.random() < 0.3
    return Case(i, method.path, target, creds, valid, md, msgs, kinds, keep_open)


CI_SEED = 41


def test_fuzz_requests():
    # a fixed seed in the suite (a CI run is repeatable); `make soak` draws a new one each run
    default_seed = CI_SEED if soak_factor() <= 1 else random.SystemRandom().randrange(2**31)
    seed = int(os.environ.get("TICKWIRE_FUZZ_SEED") or default_seed)
    budget = float(os.environ.get("TICKWIRE_FUZZ_SECONDS") or (100 * soak_factor() if soak_factor() > 1 else 40))
    only = os.environ.get("TICKWIRE_FUZZ_ITER")
    skip = {s.strip() for s in (os.environ.get("TICKWIRE_FUZZ_SKIP") or "").split(",") if s.strip()}
    print(f"\nfuzz seed {seed} (TICKWIRE_FUZZ_SEED={seed}), budget {budget:.0f} s, "
          f"skipping {sorted(skip) or 'nothing'}")
    servers = Servers(seed)
    pools = Pools()
    failures: dict[tuple, Failure] = {}
    calls: Counter = Counter()
    kinds_seen: Counter = Counter()
    codes: Counter = Counter()
    checkpoints: list[str] = []
    client = None
    try:
        servers.open_sessions()
        handled = {"main": registered(servers.main), "psk": registered(servers.psk)}
        client = BarrageClient(servers.main.target)
        subs = {name: client.subscribe(name) for name in ("ticking_keyed", "ticking_append")}
        servers.thread.start()
        for s in subs.values():
            assert s.wait_for(lambda x: x.update_count >= 1, 20), "the healthy subscriber got no snapshot"
        iterations = [int(only)] if only else range(10**9)
        t0 = time.monotonic()
        next_check = t0 + budget / 4
        stopped = None
        n = 0
        for i in iterations:
            if time.monotonic() - t0 > budget:
                break
            n += 1
            case = make_case(seed, i, servers, pools, skip)
            if skip.intersection(case.kinds):
                continue
            out = invoke(servers.channels[case.target], case, case.metadata)
            calls[case.method.rsplit("/", 1)[1]] += 1
            kinds_seen.update(set(case.kinds))
            codes[out.code.name] += 1
            for what in problems(case, out, handled[case.target]):
                key = failure_class(case.method, out, what)
                f = failures.get(key)
                if f is None:
                    f = failures[key] = Failure(case, out, what, count=0)
                elif sum(map(len, case.messages)) < sum(map(len, f.case.messages)):
                    f.case, f.outcome, f.what = case, out, what  # keep the smallest replay body
                f.count += 1
                f.methods[case.method.rsplit("/", 1)[1]] += 1
                if len(f.iterations) < 5:
                    f.iterations.append(i)
            if case.method == CLOSE_PATH and out.code == SC.OK and case.creds.startswith("bearer-"):
                label = case.creds[-1]
                servers.session(case.target, label, [1] if label == "P" else pools.own_exports if label == "A"
                                else pools.other_exports)
            if out.code == SC.DEADLINE_EXCEEDED or n % 50 == 0:
                why = servers.alive()
                if why is not None:
                    stopped = f"the server stopped answering ({why}) after iteration {i} ({case.method})"
                    break
            if time.monotonic() >= next_check:
                checkpoints.append(converged(servers, client, subs) or "ok")
                next_check = time.monotonic() + budget / 4
        elapsed = time.monotonic() - t0
        final = (converged(servers, client, subs) or "ok") if stopped is None else "skipped: " + stopped
    finally:
        if client is not None:
            client.close()
        servers.close()
    total = sum(calls.values())
    print(f"{total} calls in {elapsed:.1f} s ({60 * total / max(elapsed, 1e-9):.0f} a minute), seed {seed}")
    print("calls per method: " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items())))
    print("statuses: " + ", ".join(f"{k} {v}" for k, v in codes.most_common()))
    print("mutation kinds: " + ", ".join(f"{k} {v}" for k, v in kinds_seen.most_common()))
    print(f"checkpoints: {checkpoints}, final: {final}")
    report = []
    for (_what, code, _prefix), f in sorted(failures.items()):
        c = f.case
        report.append(f"- {f.what}: {code} {f.outcome.details[:300]!r} ({f.count} calls: "
                      f"{dict(f.methods.most_common(8))}, iterations {f.iterations}); smallest: {c.method} "
                      f"TICKWIRE_FUZZ_SEED={seed} TICKWIRE_FUZZ_ITER={c.iteration} (target {c.target}, credentials "
                      f"{c.creds}, kinds {sorted(set(c.kinds))}, keep_open {c.keep_open}); body hex: {c.body_hex()}")
    if stopped:
        report.append(f"- {stopped}")
    if servers.ticker_error is not None:
        report.append(f"- the engine's cycle failed: {servers.ticker_error!r}")
    bad_checks = [c for c in checkpoints + [final] if c != "ok"]
    report += [f"- convergence: {c}" for c in bad_checks]
    assert not report, (f"fuzz seed {seed}: {len(report)} failure class(es)\n" + "\n".join(report))

