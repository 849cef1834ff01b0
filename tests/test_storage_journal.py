"""The journal record format: whole records read back, torn tails found, corruption refused."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from tickwire.server.engine.storage.journal import HEADER, JournalCorrupt, decode_data, encode_record, scan


def batch(lo: int, n: int) -> pa.Table:
    return pa.table({"k": pa.array(range(lo, lo + n), pa.int64()), "s": [f"v{i}" for i in range(lo, lo + n)]})


def journal(count: int = 5) -> tuple[bytes, list[int]]:
    parts, ends, pos = [], [], 0
    for i in range(count):
        rec = encode_record({"step": i + 1, "kind": "add", "batch_id": 100 + i},
                            batch(i * 10, 10) if i % 2 == 0 else None)
        parts.append(rec)
        pos += len(rec)
        ends.append(pos)
    return b"".join(parts), ends


def test_records_read_back_whole():
    data, ends = journal()
    res = scan(data)
    assert res.torn == 0 and res.valid_end == len(data)
    assert [r.meta["batch_id"] for r in res.records] == [100, 101, 102, 103, 104]
    assert [r.end for r in res.records] == ends
    assert decode_data(res.records[0]).equals(batch(0, 10))
    assert decode_data(res.records[1]) is None
    assert decode_data(res.records[4]).column("s").to_pylist()[-1] == "v49"


def test_every_cut_of_the_last_record_is_a_torn_tail():
    data, ends = journal(3)
    for cut in range(ends[1] + 1, len(data)):
        res = scan(data[:cut])
        assert [r.meta["step"] for r in res.records] == [1, 2], cut
        assert res.valid_end == ends[1] and res.torn == cut - ends[1]


def test_a_flipped_bit_in_the_last_record_is_torn_in_an_earlier_one_is_corrupt():
    data, ends = journal(3)
    last = bytearray(data)
    last[ends[1] + HEADER.size + 7] ^= 0x40
    res = scan(bytes(last))
    assert len(res.records) == 2 and res.valid_end == ends[1]
    middle = bytearray(data)
    middle[ends[0] + HEADER.size + 7] ^= 0x40
    with pytest.raises(JournalCorrupt, match=f"offset {ends[0]} fails its checksum"):
        scan(bytes(middle))


def test_a_zero_filled_tail_is_torn_other_garbage_is_corrupt():
    data, ends = journal(2)
    assert scan(data + bytes(4096)).valid_end == len(data)
    with pytest.raises(JournalCorrupt, match=f"no journal record at offset {len(data)}"):
        scan(data + b"garbage that is long enough to be a header")


def test_random_damage_never_raises_anything_else():
    data, _ends = journal(6)
    rng = random.Random(7)
    for _ in range(500):
        buf = bytearray(data[: rng.randrange(len(data) + 1)])
        for _ in range(rng.randrange(3)):
            if buf:
                buf[rng.randrange(len(buf))] = rng.randrange(256)
        try:
            res = scan(bytes(buf))
        except JournalCorrupt:
            continue
        assert res.valid_end + res.torn == len(buf)
        for r in res.records:
            decode_data(r)  # a record that passed its checksum decodes
