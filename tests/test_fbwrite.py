"""tickwire.protocol.fbwrite writes the bytes flatbuffers.Builder writes for the same calls: the
update metadata and its wrapper, and an Arrow record batch's message header, built here through
the generic builder as the reference, are equal byte for byte over random messages (every field
present or absent, scalars at and off their defaults, row sets of every length modulo the
alignments, shared and distinct vtables)."""
from __future__ import annotations

import random
from typing import Optional

import pytest

import flatbuffers
from tickwire.protocol import barrage
from tickwire.protocol.batches import HEADER_RECORD_BATCH, METADATA_V5, _message_header, read_message_header
from tickwire.protocol.fb.arrow import Buffer as FbBuffer
from tickwire.protocol.fb.arrow import FieldNode as FbFieldNode
from tickwire.protocol.fb.arrow import Message as FbMessage
from tickwire.protocol.fb.arrow import RecordBatch as FbRecordBatch
from tickwire.protocol.fb.barrage import BarrageMessageWrapper as FbWrapper
from tickwire.protocol.fb.barrage import BarrageModColumnMetadata as FbModCol
from tickwire.protocol.fb.barrage import BarrageUpdateMetadata as FbUpdate
from tickwire.protocol.fbwrite import FbWriter


def _vec(b: flatbuffers.Builder, data: Optional[bytes]) -> int:
    return 0 if data is None else b.CreateByteVector(data)


def reference_metadata(md: barrage.UpdateMetadata, raw: dict) -> bytes:
    """The metadata through flatbuffers.Builder, in the order of docs/messages.md#builder-order."""
    b = flatbuffers.Builder(256)
    ev, ecs, added, removed, shifts, included = (_vec(b, raw[k]) for k in (
        "effective_viewport", "effective_column_set", "added_rows", "removed_rows", "shift_data",
        "added_rows_included"))
    mods = 0
    if raw["mod_column_nodes"] is not None:
        nodes = []
        for data in raw["mod_column_nodes"]:
            v = _vec(b, data)
            FbModCol.Start(b)
            if v:
                FbModCol.AddModifiedRows(b, v)
            nodes.append(FbModCol.End(b))
        FbUpdate.StartModColumnNodesVector(b, len(nodes))
        for n in reversed(nodes):
            b.PrependUOffsetTRelative(n)
        mods = b.EndVector()
    FbUpdate.Start(b)
    FbUpdate.AddIsSnapshot(b, bool(md.is_snapshot))
    FbUpdate.AddFirstSeq(b, md.first_seq)
    FbUpdate.AddLastSeq(b, md.last_seq)
    for add, off in ((FbUpdate.AddEffectiveViewport, ev), (FbUpdate.AddEffectiveColumnSet, ecs),
                     (FbUpdate.AddAddedRows, added), (FbUpdate.AddRemovedRows, removed),
                     (FbUpdate.AddShiftData, shifts), (FbUpdate.AddAddedRowsIncluded, included),
                     (FbUpdate.AddModColumnNodes, mods)):
        if off:
            add(b, off)
    FbUpdate.AddEffectiveReverseViewport(b, bool(md.effective_reverse_viewport))
    FbUpdate.AddTableSize(b, md.table_size)
    b.Finish(FbUpdate.End(b))
    return bytes(b.Output())


def reference_wrapper(mt: int, payload: Optional[bytes], magic: int = barrage.MAGIC) -> bytes:
    b = flatbuffers.Builder(64)
    p = _vec(b, payload)
    FbWrapper.Start(b)
    if mt == barrage.BarrageMessageType.UPDATE_METADATA:
        FbWrapper.AddMagic(b, magic)
        FbWrapper.AddMsgType(b, mt)
        if p:
            FbWrapper.AddMsgPayload(b, p)
    else:
        if p:
            FbWrapper.AddMsgPayload(b, p)
        FbWrapper.AddMagic(b, magic)
        FbWrapper.AddMsgType(b, mt)
    b.Finish(FbWrapper.End(b))
    return bytes(b.Output())


def _maybe_bytes(rng: random.Random) -> Optional[bytes]:
    if rng.random() < 0.25:
        return None
    return bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 2, 3, 4, 5, 7, 8, 9, rng.randrange(10, 70)])))


@pytest.mark.parametrize("seed", range(40))
def test_update_metadata_bytes_equal_the_builders(seed):
    rng = random.Random(seed)
    for _ in range(50):
        raw = {k: _maybe_bytes(rng) for k in ("effective_viewport", "effective_column_set", "added_rows",
                                              "removed_rows", "shift_data", "added_rows_included")}
        n_mods = rng.choice([None, 0, 1, 2, 3, 5])
        if n_mods is None:
            raw["mod_column_nodes"] = None
        else:  # the same bytes for several columns (a keyed upsert) share nothing but may share vtables
            same = _maybe_bytes(rng)
            raw["mod_column_nodes"] = [same if rng.random() < 0.5 else _maybe_bytes(rng) for _ in range(n_mods)]
        md = barrage.UpdateMetadata(first_seq=rng.choice([0, 1, rng.randrange(-2**63, 2**63)]),
                                    last_seq=rng.choice([0, 7, rng.randrange(-2**63, 2**63)]),
                                    is_snapshot=rng.random() < 0.5,
                                    effective_reverse_viewport=rng.random() < 0.5,
                                    table_size=rng.choice([0, 3, rng.randrange(0, 2**63)]))
        got = md.encode_with(**raw)
        assert got == reference_metadata(md, raw)
        for mt in (barrage.BarrageMessageType.UPDATE_METADATA, barrage.BarrageMessageType.SUBSCRIPTION_REQUEST):
            assert (barrage.BarrageMessageWrapper(msg_type=int(mt), payload=got).to_bytes()
                    == reference_wrapper(int(mt), got))


def test_wrapper_without_payload_and_with_magic_zero():
    for mt in (barrage.BarrageMessageType.UPDATE_METADATA, barrage.BarrageMessageType.SNAPSHOT_REQUEST):
        assert (barrage.BarrageMessageWrapper(msg_type=int(mt), payload=None).to_bytes()
                == reference_wrapper(int(mt), None))
        assert (barrage.BarrageMessageWrapper(msg_type=int(mt), payload=b"x", magic=0).to_bytes()
                == reference_wrapper(int(mt), b"x", magic=0))
    for mt in (0, 200):  # the default type (left out), a custom one (a negative byte)
        assert (barrage.BarrageMessageWrapper(msg_type=mt, payload=b"xy").to_bytes()
                == reference_wrapper(mt - 256 if mt > 127 else mt, b"xy"))


def test_a_vtable_equal_to_an_earlier_one_is_shared():
    w = FbWriter()
    b = flatbuffers.Builder(0)
    tables, refs = [], []
    for data in (b"abc", b"defg"):
        v = w.bytes_vector(data)
        w.start(1)
        w.offset(0, v)
        tables.append(w.end())
        r = b.CreateByteVector(data)
        FbModCol.Start(b)
        FbModCol.AddModifiedRows(b, r)
        refs.append(FbModCol.End(b))
    got = w.finish(w.offsets_vector(tables))
    b.StartVector(4, 2, 4)
    for r in reversed(refs):
        b.PrependUOffsetTRelative(r)
    b.Finish(b.EndVector())
    assert got == bytes(b.Output())
    assert len(w._vtables) == 1  # two tables of one shape: one vtable written


def reference_batch_header(length: int, nodes: list, buffers: list, body_length: int) -> bytes:
    """Message{RecordBatch} through flatbuffers.Builder, in Deephaven's order
    (docs/messages.md#record-batch-headers)."""
    b = flatbuffers.Builder(128)
    FbRecordBatch.StartNodesVector(b, len(nodes))
    for ln, nc in reversed(nodes):
        FbFieldNode.CreateFieldNode(b, ln, nc)
    nodes_vec = b.EndVector()
    FbRecordBatch.StartBuffersVector(b, len(buffers))
    for off, ln in reversed(buffers):
        FbBuffer.CreateBuffer(b, off, ln)
    buffers_vec = b.EndVector()
    FbRecordBatch.Start(b)
    FbRecordBatch.AddNodes(b, nodes_vec)
    FbRecordBatch.AddBuffers(b, buffers_vec)
    FbRecordBatch.AddLength(b, length)
    rb = FbRecordBatch.End(b)
    FbMessage.Start(b)
    FbMessage.AddHeaderType(b, HEADER_RECORD_BATCH)
    FbMessage.AddHeader(b, rb)
    FbMessage.AddVersion(b, METADATA_V5)
    FbMessage.AddBodyLength(b, body_length)
    b.Finish(FbMessage.End(b))
    return bytes(b.Output())


@pytest.mark.parametrize("seed", range(20))
def test_record_batch_headers_equal_the_builders(seed):
    rng = random.Random(seed)

    def big() -> int:
        return rng.choice([0, 1, 8, 255, rng.randrange(0, 2**31), rng.randrange(0, 2**63)])

    for _ in range(100):
        nodes = [(big(), big()) for _ in range(rng.choice([0, 1, 2, 3, 7, rng.randrange(8, 40)]))]
        buffers = [(big(), big()) for _ in range(rng.choice([0, 1, 2, 3, 6, rng.randrange(7, 80)]))]
        length, body = big(), big()
        got = _message_header(length, nodes, buffers, body)
        assert got == reference_batch_header(length, nodes, buffers, body)
        info = read_message_header(got)  # and it reads back as what was written
        assert info.header_type == HEADER_RECORD_BATCH
        assert [tuple(int(x) for x in n) for n in info.nodes] == nodes
        assert [tuple(int(x) for x in b) for b in info.buffers] == buffers
