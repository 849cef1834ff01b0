"""Staged, exactly-once writes over Flight (protocol/txn.py, server/engine/staging.py): DoPut with a
transaction in its app_metadata, the tickwire.commit / tickwire.abort / tickwire.staging actions."""
from __future__ import annotations

import functools
import json
import threading
import time

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tickwire.clock import ManualClock
from tickwire.protocol.txn import AbortRequest, CommitRequest, Transaction
from tickwire.server.adapters.spark import sink
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, EngineConfig, StagingLimits

# what pyarrow raises for a refused call (it maps INVALID_ARGUMENT and FAILED_PRECONDITION to ArrowInvalid)
ERRORS = (fl.FlightError, pa.ArrowException)
AUTH = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")], timeout=30)


@pytest.fixture
def server():
    engine = Engine(interval_ms=20)
    srv = TickwireServer(engine, port=0, web=False).start()
    yield srv
    srv.stop()
    engine.stop()


def connect(srv) -> fl.FlightClient:
    return fl.connect(f"grpc://127.0.0.1:{srv.port}")


def put(client, name: str, data: pa.Table, txn: Transaction | bytes | None, *, chunks: int = 1) -> dict:
    """A DoPut of `data` (in `chunks` record batches) with `txn` as app_metadata; the JSON of the
    last PutResult that had app_metadata."""
    writer, reader = client.do_put(fl.FlightDescriptor.for_path("scope", name), data.schema, options=AUTH)
    out: dict = {}
    try:
        if txn is not None:
            writer.write_metadata(txn.to_json() if isinstance(txn, Transaction) else txn)
        step = max(1, -(-data.num_rows // chunks))
        for i in range(0, data.num_rows, step):
            writer.write_table(data.slice(i, step))
        writer.done_writing()
        while True:
            buf = reader.read()
            if buf is None:
                break
            if buf.size:
                out = json.loads(buf.to_pybytes())
    finally:
        writer.close()
    return out


def action(client, kind: str, body) -> dict:
    raw = body.to_json() if hasattr(body, "to_json") else body
    (res,) = list(client.do_action(fl.Action(kind, raw), options=AUTH))
    return json.loads(res.body.to_pybytes())


def status(client) -> dict:
    return action(client, "tickwire.staging", b"")


def doget(client, name: str) -> pa.Table:
    return client.do_get(fl.Ticket(b"s/" + name.encode()), options=AUTH).read_all()


def rows(t: pa.Table, keys=None) -> list:
    d = t.select(list(t.column_names)).to_pylist()
    return sorted(d, key=lambda r: tuple(str(r[k]) for k in (keys or t.column_names)))


T = pa.table({"k": ["a", "b", "c"], "v": [1, 2, 3]})


def test_a_committed_put_applies_once_and_a_replay_is_acknowledged(server):
    c = connect(server)
    assert put(c, "t", T, Transaction(producer="p1", batch=0)) == {"applied": True, "replay": False, "rows": 3}
    assert put(c, "t", T, Transaction(producer="p1", batch=0)) == {"applied": False, "replay": True, "rows": 0}
    assert doget(c, "t").num_rows == 3
    # another producer's batch 0 is another batch; the same producer's next batch too
    assert put(c, "t", T, Transaction(producer="p2", batch=0))["applied"]
    assert put(c, "t", T, Transaction(producer="p1", batch=1))["applied"]
    assert doget(c, "t").num_rows == 9
    assert status(c)["bytes"] == 0  # committed parts are gone


def test_staged_parts_are_invisible_until_one_commit_publishes_them_in_one_cycle(server):
    c = connect(server)
    parts = [pa.table({"k": [f"{i}-{j}" for j in range(50)], "v": list(range(50))}) for i in range(3)]
    for i, part in enumerate(parts):
        res = put(c, "staged", part, Transaction(producer="q", batch=7, part=str(i), attempt=str(10 + i),
                                                 commit=False), chunks=3)
        assert res == {"staged": True, "rows": 50, "bytes": res["bytes"]} and res["bytes"] > 0
    assert server.engine.resolve("staged") is None  # nothing made or shown before the commit
    st = status(c)
    assert [(b["producer"], b["batch"], len(b["parts"])) for b in st["batches"]] == [("q", 7, 3)]
    assert st["bytes"] == st["producers"]["q"] > 0

    req = CommitRequest(producer="q", batch=7, table="staged", mode="append",
                        parts=(("0", "10"), ("1", "11"), ("2", "12")))
    assert action(c, "tickwire.commit", req) == {"applied": True, "replay": False, "rows": 150}
    got = doget(c, "staged")
    assert got.column("k").to_pylist() == [k for p in parts for k in p.column("k").to_pylist()]  # in part order
    assert status(c)["bytes"] == 0
    assert action(c, "tickwire.commit", req) == {"applied": False, "replay": True, "rows": 0}
    assert doget(c, "staged").num_rows == 150


def test_a_commit_in_one_cycle_for_an_existing_table(server):
    c = connect(server)
    assert put(c, "one", T, Transaction(producer="x", batch=0))["applied"]
    updates = []
    server.engine.resolve("one").add_listener(lambda t, u, step: updates.append(u.added.size))
    for i in range(4):
        put(c, "one", T, Transaction(producer="x", batch=1, part=str(i), commit=False))
    res = action(c, "tickwire.commit", CommitRequest(producer="x", batch=1, table="one", mode="append",
                                                     parts=tuple((str(i), "0") for i in range(4))))
    assert res["rows"] == 12
    assert updates == [12]


def test_a_missing_part_fails_the_commit_and_applies_nothing(server):
    c = connect(server)
    put(c, "m", T, Transaction(producer="q", batch=3, part="0", attempt="1", commit=False))
    req = CommitRequest(producer="q", batch=3, table="m", mode="append", parts=(("0", "1"), ("1", "2")))
    with pytest.raises(ERRORS,
                       match=r"precondition failed.*part '1' \(attempt '2'\) is not staged.*write the batch again"):
        action(c, "tickwire.commit", req)
    assert server.engine.resolve("m") is None
    assert status(c)["batches"][0]["parts"][0]["part"] == "0"  # what was staged stays
    assert action(c, "tickwire.abort", AbortRequest("q", 3)) == {"discarded": 1}
    st = status(c)
    assert st["bytes"] == 0 and not st["batches"] and not st["producers"]


def test_only_the_committed_attempt_counts_and_other_attempts_are_dropped(server):
    c = connect(server)
    dead = pa.table({"k": ["dead"], "v": [0]})
    # an older batch's leftovers (never committed) go when a newer one commits
    put(c, "att", dead, Transaction(producer="q", batch=4, part="0", attempt="1", commit=False))
    put(c, "att", dead, Transaction(producer="q", batch=5, part="0", attempt="1", commit=False))
    put(c, "att", T, Transaction(producer="q", batch=5, part="0", attempt="2", commit=False))
    put(c, "att", dead, Transaction(producer="q", batch=5, part="9", attempt="1", commit=False))
    assert len(status(c)["batches"]) == 2
    res = action(c, "tickwire.commit", CommitRequest(producer="q", batch=5, table="att", mode="append",
                                                     parts=(("0", "2"),)))
    assert res["rows"] == 3
    assert doget(c, "att").column("k").to_pylist() == ["a", "b", "c"]
    assert status(c)["bytes"] == 0 and not status(c)["batches"]


def _stepped(engine: Engine, call):
    """`call()`'s result, the engine's cycles run here until it returns."""
    out: dict = {}

    def run():
        try:
            out["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - raised again below
            out["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    while t.is_alive():
        engine.run_cycle()
        t.join(0.01)
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_the_modes_give_what_the_in_process_sink_gives():
    """Each mode through staged parts and a commit equals the in-process sink fed the same batches.
    The server's cycles run only when the test runs them, so a blink table still holds the rows of
    the cycle that applied a commit when it is read."""
    engine = Engine(interval_ms=3_600_000)
    server = TickwireServer(engine, port=0, web=False).start()
    try:
        _modes_match_the_sink(engine, server)
    finally:
        server.stop()
        engine.stop()


def _modes_match_the_sink(engine: Engine, server) -> None:
    c = connect(server)
    reference = Engine()  # stepped here with run_cycle()
    batches = [
        pa.table({"k": ["a", "b", "c", "d"], "v": [1, 2, 3, 4], "gone": [False, False, False, False]}),
        pa.table({"k": ["b", "c", "e", "a"], "v": [20, 3, 5, 1], "gone": [False, True, False, True]}),
        pa.table({"k": ["e", "f"], "v": [50, 6], "gone": [False, False]}),
    ]
    cases = [("append", {}, None), ("upsert", {"keys": ("k",), "delete_column": "gone"}, "gone"),
             ("replace", {"keys": ("k",)}, None), ("blink", {}, None), ("append", {"max_rows": 5}, None)]
    for n, (mode, opts, delete) in enumerate(cases):
        name = f"mode{n}"
        ref = sink(reference, name, mode=mode, keys=list(opts.get("keys", ())) or None, delete_column=delete,
                   max_rows=opts.get("max_rows"))
        for b, data in enumerate(batches):
            data = data if delete else data.drop_columns(["gone"])
            ref.write(data, b)
            reference.run_cycle()
            half = data.num_rows // 2
            for i, piece in enumerate((data.slice(0, half), data.slice(half))):
                put(c, name, piece, Transaction(producer="m", batch=b, part=str(i), commit=False, mode=mode, **opts))
            commit = CommitRequest(producer="m", batch=b, table=name, mode=mode, parts=(("0", "0"), ("1", "0")),
                                   **opts)
            res = _stepped(engine, functools.partial(action, c, "tickwire.commit", commit))
            assert res["applied"], (mode, b, res)
            want = reference.resolve(name).to_arrow()
            got = doget(c, name).select(want.column_names)
            assert got.to_pylist() == want.to_pylist(), (mode, opts, b)


def test_an_oversized_part_is_refused_and_a_full_staging_area_makes_uploads_wait():
    engine = Engine(EngineConfig(interval_ms=20, staging=StagingLimits(producer_bytes=4000, total_bytes=6000,
                                                                       wait_s=10)))
    srv = TickwireServer(engine, port=0, web=False).start()
    try:
        c = connect(srv)
        big = pa.table({"v": list(range(1000))})  # 8,000 bytes
        with pytest.raises(ERRORS, match="needs more than the 4000 bytes a producer may stage"):
            put(c, "b", big, Transaction(producer="p", batch=0, commit=False))
        assert status(c)["bytes"] == 0  # nothing of the refused part stays
        small = pa.table({"v": list(range(400))})  # 3,200 bytes
        put(c, "b", small, Transaction(producer="p", batch=0, commit=False))
        took = {}

        def second():
            t0 = time.monotonic()
            took["res"] = put(connect(srv), "b", small, Transaction(producer="p", batch=1, commit=False))
            took["s"] = time.monotonic() - t0

        th = threading.Thread(target=second)
        th.start()
        time.sleep(1.0)
        assert th.is_alive()  # waiting for room: the first part holds the producer's limit
        assert status(c)["bytes"] == 3200
        action(c, "tickwire.commit", CommitRequest(producer="p", batch=0, table="b", mode="append",
                                                   parts=(("0", "0"),)))
        th.join(10)
        assert took["res"]["staged"] and took["s"] >= 0.9
        assert status(c)["bytes"] == 3200
        action(c, "tickwire.commit", CommitRequest(producer="p", batch=1, table="b", mode="append",
                                                   parts=(("0", "0"),)))
        assert doget(c, "b").num_rows == 800
    finally:
        srv.stop()
        engine.stop()


def test_a_full_staging_area_answers_resource_exhausted_after_the_wait():
    engine = Engine(EngineConfig(interval_ms=20, staging=StagingLimits(producer_bytes=4000, total_bytes=4000,
                                                                       wait_s=0.5)))
    srv = TickwireServer(engine, port=0, web=False).start()
    try:
        c = connect(srv)
        small = pa.table({"v": list(range(400))})
        put(c, "b", small, Transaction(producer="p", batch=0, commit=False))
        with pytest.raises(ERRORS, match="no room to stage batch 0 .* of producer 'other'"):
            put(c, "b", small, Transaction(producer="other", batch=0, commit=False))
        assert status(c)["bytes"] == 3200
    finally:
        srv.stop()
        engine.stop()


def test_uncommitted_parts_expire():
    clock = ManualClock()  # the staging TTL runs on the engine's clock
    engine = Engine(EngineConfig(interval_ms=20, staging=StagingLimits(ttl_s=0.3)), clock=clock)
    srv = TickwireServer(engine, port=0, web=False).start()
    try:
        c = connect(srv)
        put(c, "e", T, Transaction(producer="p", batch=0, commit=False))
        clock.advance(0.5)
        put(c, "e", T, Transaction(producer="p", batch=1, part="0", commit=False))  # a later call sweeps
        st = status(c)
        assert st["expired"] == 1 and [b["batch"] for b in st["batches"]] == [1]
        with pytest.raises(ERRORS, match="is not staged"):
            action(c, "tickwire.commit", CommitRequest(producer="p", batch=0, table="e", mode="append",
                                                       parts=(("0", "0"),)))
    finally:
        srv.stop()
        engine.stop()


@pytest.mark.parametrize("meta, message", [
    (b'{"tickwire": "txn", "batch": 1}', "'producer' must be a name"),
    (b'{"tickwire": "txn", "producer": "p", "batch": -1}', "'batch' must be an integer"),
    (b'{"tickwire": "txn", "producer": "p", "batch": 1, "colour": 1}', "unknown field 'colour'"),
    (b'{"tickwire": "txn", "producer": "p", "batch": 1, "mode": "merge"}', "'mode' must be one of"),
    (b'{"tickwire": "txn", "producer": "p", "batch": 1, "mode": "upsert"}', "mode 'upsert' needs keys"),
    (b'{"tickwire": "txn", "producer": "p", "batch": 1, "keys": ["nope"]}', "key column 'nope' is not in the batch"),
    (b'{not json', "not a JSON object"),
])
def test_bad_transactions_are_refused_with_a_clear_message(server, meta, message):
    c = connect(server)
    with pytest.raises(ERRORS, match=message):
        put(c, "bad", T, meta)
    assert server.engine.resolve("bad") is None
    assert status(c)["bytes"] == 0
    assert put(c, "ok", T, Transaction(producer="p", batch=0))["applied"]  # still serving


def test_refusals_name_the_table_and_leave_it_as_it_was(server):
    c = connect(server)
    assert put(c, "kv", T, Transaction(producer="p", batch=0, mode="upsert", keys=("k",)))["applied"]
    with pytest.raises(ERRORS, match="mode 'append' needs an append table, but the table is a keyed table"):
        put(c, "kv", T, Transaction(producer="p", batch=1))
    other = pa.table({"k": ["a"], "v": ["text"]})
    with pytest.raises(ERRORS, match="column 'v' is string in the batch but int64 in the table"):
        put(c, "kv", other, Transaction(producer="p", batch=1, mode="upsert", keys=("k",)))
    with pytest.raises(ERRORS, match="names starting with '__' are reserved"):
        put(c, "__sys", T, Transaction(producer="p", batch=0))
    with pytest.raises(ERRORS, match="transaction must come before the first record batch"):
        writer, reader = c.do_put(fl.FlightDescriptor.for_path("scope", "kv"), T.schema, options=AUTH)
        try:
            writer.write_table(T)
            writer.write_metadata(Transaction(producer="p", batch=2).to_json())
            writer.done_writing()
            while reader.read() is not None:
                pass
        finally:
            writer.close()
    assert doget(c, "kv").num_rows == 3 and status(c)["bytes"] == 0


def test_plain_doput_keeps_its_meaning(server):
    c = connect(server)
    assert put(c, "plain", T, None) == {}
    assert put(c, "plain", T, None) == {}
    assert doget(c, "plain").num_rows == 6  # no batch id: each upload appends


def test_a_durable_table_remembers_committed_batches_across_a_restart(tmp_path):
    engine = Engine(EngineConfig(interval_ms=20, data_dir=tmp_path))
    srv = TickwireServer(engine, port=0, web=False).start()
    port = srv.port
    try:
        c = connect(srv)
        for b in range(3):
            put(c, "d", T, Transaction(producer="q", batch=b, part="0", commit=False))
            action(c, "tickwire.commit", CommitRequest(producer="q", batch=b, table="d", mode="append",
                                                       parts=(("0", "0"),)))
        # staged but never committed when the server goes away
        put(c, "d", T, Transaction(producer="q", batch=3, part="0", commit=False))
    finally:
        srv.stop()
        engine.stop()
    engine = Engine(EngineConfig(interval_ms=20, data_dir=tmp_path))  # the same data directory
    srv = TickwireServer(engine, port=port, web=False).start()
    try:
        c = connect(srv)
        assert doget(c, "d").num_rows == 9
        assert status(c)["bytes"] == 0
        with pytest.raises(ERRORS, match="is not staged"):
            action(c, "tickwire.commit", CommitRequest(producer="q", batch=3, table="d", mode="append",
                                                       parts=(("0", "0"),)))
        # the producer writes batch 2 again (it did not see its commit) and then 3
        for b in (2, 3):
            put(c, "d", T, Transaction(producer="q", batch=b, part="0", commit=False))
            res = action(c, "tickwire.commit", CommitRequest(producer="q", batch=b, table="d", mode="append",
                                                             parts=(("0", "0"),)))
            assert res["applied"] == (b == 3)
        assert doget(c, "d").num_rows == 12
    finally:
        srv.stop()
        engine.stop()


def test_serve_takes_the_staging_limits_from_its_command_line():
    from tests.serving import serve_process

    with serve_process("--no-web", "--staging-limit-mb", "3", "--staging-ttl", "42") as port:
        c = fl.connect(f"grpc://127.0.0.1:{port}")
        assert status(c)["producer_limit"] == 3 << 20 and status(c)["ttl_s"] == 42
        big = pa.table({"v": pa.array(range(500_000), pa.int64())})  # 4 MB: more than one producer may stage
        with pytest.raises(ERRORS, match=f"needs more than the {3 << 20} bytes"):
            put(c, "t", big, Transaction(producer="p", batch=0, commit=False))


def test_empty_parts_cannot_pile_up():
    """Parts are bounded by count as well as bytes: an empty part holds no bytes."""
    engine = Engine(EngineConfig(interval_ms=20, staging=StagingLimits(max_parts=3, max_parts_total=5)))
    srv = TickwireServer(engine, port=0, web=False).start()
    try:
        c = connect(srv)
        empty = T.slice(0, 0)
        for i in range(3):
            assert put(c, "e", empty, Transaction(producer="p", batch=0, part=str(i), commit=False))["staged"]
        with pytest.raises(ERRORS, match="3 parts are staged already, the most a producer may have"):
            put(c, "e", empty, Transaction(producer="p", batch=0, part="3", commit=False))
        for i in range(2):
            put(c, "e", empty, Transaction(producer="q", batch=0, part=str(i), commit=False))
        with pytest.raises(ERRORS, match="5 parts are staged already, the most the server may have"):
            put(c, "e", empty, Transaction(producer="r", batch=0, commit=False))
        assert status(c)["parts"] == 5
        assert action(c, "tickwire.abort", AbortRequest("p", 0)) == {"discarded": 3}
        assert status(c)["parts"] == 2
        assert put(c, "e", empty, Transaction(producer="p", batch=1, commit=False))["staged"]  # room again
        # a refused upload (a bad batch) gives its part back
        writer, reader = c.do_put(fl.FlightDescriptor.for_path("scope", "e"), T.schema, options=AUTH)
        with pytest.raises(ERRORS):
            try:
                writer.write_metadata(Transaction(producer="p", batch=2, commit=False).to_json())
                writer.write_table(pa.table({"k": ["x"], "v": [1]}).cast(pa.schema([("k", pa.string()),
                                                                                     ("v", pa.int64())])))
                writer.write_metadata(Transaction(producer="p", batch=2, commit=False).to_json())
                writer.done_writing()
                while reader.read() is not None:
                    pass
            finally:
                writer.close()
        assert status(c)["parts"] == 3
    finally:
        srv.stop()
        engine.stop()
