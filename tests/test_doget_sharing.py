"""DoGets of a table that has not changed share one encoding (tickwire.server.services.doget_cache):
the second reads the first's payloads, DoGets that arrive while it is produced follow it, a
change of the table (or its failure) is never hidden, and tables too big to keep are streamed by
each DoGet alone."""
from __future__ import annotations

import threading

import grpc
import numpy as np
import pyarrow as pa
import pytest

from tests.harness import Services, until
from tickwire.server.engine import TableSpec
from tickwire.server.engine.publishing import DogetSnapshot
from tickwire.server.services.doget_cache import DogetCache


@pytest.fixture()
def takes(monkeypatch):
    """How many DoGets gathered their table (DogetSnapshot.take), with a gate a test may close."""
    real = DogetSnapshot.take.__func__
    seen = {"n": 0, "gate": None, "entered": threading.Event()}

    def spy(cls, wire, **kw):
        seen["n"] += 1
        seen["entered"].set()
        if seen["gate"] is not None:
            seen["gate"].wait(30)
        return real(cls, wire, **kw)

    monkeypatch.setattr(DogetSnapshot, "take", classmethod(spy))
    return seen


def _static(n: int) -> pa.Table:
    return pa.table({"A": np.arange(n, dtype=np.int64), "B": np.arange(n) * 0.5})


def test_a_second_doget_of_an_unchanged_static_table_reads_the_first_ones_encoding(takes):
    with Services() as s:
        s.engine.create(TableSpec("st", "static", data=_static(1000)))
        first = s.doget(b"s/st")
        second = s.doget(b"s/st")
        assert first.equals(_static(1000)) and second.equals(first)
        assert takes["n"] == 1


def test_a_ticking_table_is_gathered_again_only_after_it_changed(takes):
    with Services() as s:
        t = s.engine.create(TableSpec("ap", "append", _static(0).schema))
        s.engine.write(t, _static(3))
        s.cycle()
        assert s.doget(b"s/ap").num_rows == 3
        s.cycle()  # a cycle that does not change it
        assert s.doget(b"s/ap").num_rows == 3 and takes["n"] == 1
        s.engine.write(t, _static(2))
        s.cycle()
        got = s.doget(b"s/ap")
        assert got.column("A").to_pylist() == [0, 1, 2, 0, 1] and takes["n"] == 2


def test_dogets_that_arrive_while_one_is_produced_follow_it(takes, monkeypatch):
    looked: list = []  # per lookup: whether it found the production, and whether that was done
    real_lookup = DogetCache.lookup

    def lookup(self, table, version):
        e = real_lookup(self, table, version)
        looked.append(None if e is None else e.done)
        return e

    monkeypatch.setattr(DogetCache, "lookup", lookup)
    with Services() as s:
        s.engine.create(TableSpec("st", "static", data=_static(5000)))
        takes["gate"] = threading.Event()
        results = []

        def get():
            results.append(s.doget(b"s/st"))

        threads = [threading.Thread(target=get) for _ in range(3)]
        threads[0].start()
        assert takes["entered"].wait(30)  # the first is gathering, held at the gate
        for th in threads[1:]:
            th.start()
        # the others find the production under way (not done: its rows are held at the gate)
        assert until(lambda: len(looked) == 3)
        takes["gate"].set()
        for th in threads:
            th.join(30)
        assert len(results) == 3 and all(r.equals(_static(5000)) for r in results)
        assert looked == [None, False, False] and takes["n"] == 1


def test_a_failed_table_refuses_every_doget_even_after_a_shared_one(takes):
    with Services() as s:
        t = s.engine.create(TableSpec("ap", "append", _static(0).schema))
        s.engine.write(t, _static(3))
        s.cycle()
        d = t.where(lambda v: pa.array([True] * v.num_rows), name="d")
        assert s.doget(b"s/d").num_rows == 3
        s.engine.fail(d, "testing", RuntimeError("boom"))
        with pytest.raises(grpc.RpcError) as e:
            s.doget(b"s/d")
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_tables_too_big_to_keep_are_streamed_by_each_doget_alone(takes):
    with Services(doget_cache_bytes=4 * 16 * 1000) as s:  # a quarter: 16,000 bytes, 1,000 rows of A and B
        s.engine.create(TableSpec("small", "static", data=_static(1000)))
        s.engine.create(TableSpec("big", "static", data=_static(1001)))
        for _ in range(2):
            assert s.doget(b"s/small").num_rows == 1000
            assert s.doget(b"s/big").num_rows == 1001
        assert takes["n"] == 1 + 2
    with Services(doget_cache_bytes=0) as s:  # off
        s.engine.create(TableSpec("small", "static", data=_static(10)))
        for _ in range(2):
            assert s.doget(b"s/small").num_rows == 10
        assert takes["n"] == 3 + 2
