"""The DoPut upload decoder (tickwire.protocol.upload): every event and every refusal, fed one
FlightData at a time, built with tickwire.protocol's own helpers."""
from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from tickwire.errors import TickwireError
from tickwire.protocol import ProtocolError, barrage
from tickwire.protocol.batches import encode_record_batch
from tickwire.protocol.flight import FlightDescriptor, encode_flight_data
from tickwire.protocol.opening import put_batches, put_opening, put_options, snapshot_request
from tickwire.protocol.schema import schema_message
from tickwire.protocol.upload import (
    KEYS_METADATA,
    Batch,
    Destination,
    End,
    Options,
    UploadDecoder,
    UploadError,
    UploadSchema,
)

TABLE = pa.table({"x": pa.array([1, 2, 3], pa.int64()), "s": pa.array(["a", None, "c"])})
PATH = ["scope", "t"]
DESC = FlightDescriptor.for_path(*PATH)


def events(decoder: UploadDecoder, messages) -> list:
    out = []
    for m in messages:
        out += decoder.feed(m)
    return out


def refused(decoder: UploadDecoder, message) -> UploadError:
    with pytest.raises(UploadError) as e:
        decoder.feed(message)
    assert e.value.code == "INVALID_ARGUMENT"
    assert isinstance(e.value, ProtocolError) and isinstance(e.value, TickwireError)
    assert decoder.closed  # nothing more is accepted after a refusal
    return e.value


def opened(schema: pa.Schema = TABLE.schema, **kw) -> UploadDecoder:
    d = UploadDecoder()
    events(d, put_opening(PATH, schema, **kw))
    return d


def batch_refusal(decoder: UploadDecoder, message) -> UploadError:
    (batch,) = decoder.feed(message)
    assert isinstance(batch, Batch)
    with pytest.raises(UploadError) as e:
        batch.decode()
    assert e.value.code == "INVALID_ARGUMENT"
    return e.value


# -- events -------------------------------------------------------------------------------------------------------

def test_destination_schema_batches_and_end():
    d = UploadDecoder()
    evs = events(d, put_opening(PATH, TABLE.schema) + put_batches(TABLE) + put_batches(TABLE.slice(1)))
    assert [type(e) for e in evs] == [Destination, UploadSchema, Batch, Batch]
    assert evs[0] == Destination(PATH)
    assert evs[1].schema == TABLE.schema and evs[1].keys == ()
    assert evs[2].num_rows == 3 and evs[2].decode().equals(TABLE)
    assert evs[3].decode().equals(TABLE.slice(1))
    assert d.close() == End(PATH, TABLE.schema, (), 2)
    assert d.closed


def test_descriptor_on_its_own_message_and_repeated():
    d = UploadDecoder()
    assert d.feed(encode_flight_data(b"", None, descriptor=DESC)) == [Destination(PATH)]
    assert d.feed(encode_flight_data(b"", None, descriptor=DESC)) == []  # the same destination again
    evs = d.feed(encode_flight_data(schema_message(TABLE.schema), None, descriptor=DESC))
    assert [type(e) for e in evs] == [UploadSchema]
    assert d.feed(encode_flight_data(b"")) == []  # an empty message carries nothing
    assert d.path == PATH


def test_options_unwrap_lists_and_read_deephaven_nulls():
    d = UploadDecoder()
    evs = events(d, put_opening(PATH, TABLE.schema, use_deephaven_nulls=True, columns_as_list=True))
    assert evs[:2] == [Destination(PATH), Options(use_deephaven_nulls=True, columns_as_list=True)]
    assert evs[2].schema == TABLE.schema  # unwrapped
    (batch,) = events(d, put_batches(TABLE, use_deephaven_nulls=True, columns_as_list=True))
    assert batch.use_deephaven_nulls and batch.columns_as_list
    assert batch.decode().equals(TABLE)
    assert d.use_deephaven_nulls and d.columns_as_list


def test_deephaven_nulls_are_read_as_nulls_only_when_asked():
    t = pa.table({"x": pa.array([1, None], pa.int64())})
    sentinels = put_batches(t, use_deephaven_nulls=True)
    (plain,) = events(opened(t.schema), sentinels)
    assert plain.decode().column("x").to_pylist() == [1, -(2 ** 63)]
    d = opened(t.schema)
    d.feed(encode_flight_data(b"", put_options(use_deephaven_nulls=True)))
    (read,) = d.feed(sentinels[0])
    assert read.decode().column("x").to_pylist() == [1, None]


def test_options_of_type_subscription_request_count_and_other_metadata_is_ignored():
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", None, descriptor=DESC))
    opts = barrage.SubscriptionOptions(use_deephaven_nulls=True)
    assert d.feed(encode_flight_data(b"", barrage.wrap(barrage.SubscriptionRequest(options=opts)))) == [
        Options(True, False)]
    assert d.feed(encode_flight_data(b"", barrage.wrap(barrage.SubscriptionRequest()))) == []
    assert d.feed(encode_flight_data(b"", snapshot_request(b"s/t"))) == []
    assert d.use_deephaven_nulls


def test_keys_metadata():
    d = UploadDecoder()
    evs = events(d, put_opening(PATH, TABLE.schema, keys=["s", "x"]))
    assert evs[1].keys == ("s", "x") and evs[1].schema.metadata[KEYS_METADATA] == b"s,x"
    assert d.keys == ("s", "x")
    assert d.close().keys == ("s", "x")


def test_schema_only_upload_ends_with_no_batches():
    d = opened()
    assert d.close() == End(PATH, TABLE.schema, (), 0)


def test_batch_decoding_reads_nothing_of_the_decoder():
    d = opened()
    (batch,) = events(d, put_batches(TABLE))
    d.feed(encode_flight_data(b"", put_options(columns_as_list=True)))  # later options
    d.close()
    assert batch.decode().equals(TABLE)


# -- refusals -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [b"\x0a\xff", b"\x07", 3.5])
def test_malformed_flight_data(raw):
    assert str(refused(UploadDecoder(), raw)).startswith("malformed FlightData: FlightData")


def test_a_command_descriptor_is_refused():
    msg = encode_flight_data(b"", None, descriptor=FlightDescriptor.for_command(b"dphn"))
    assert str(refused(UploadDecoder(), msg)) == "DoPut needs a PATH flight descriptor naming the destination"


def test_a_changed_descriptor_is_refused():
    d = opened()
    msg = encode_flight_data(b"", None, descriptor=FlightDescriptor.for_path("scope", "u"))
    assert str(refused(d, msg)) == "DoPut descriptor changed from ['scope', 't'] to ['scope', 'u']"


@pytest.mark.parametrize("first", [encode_flight_data(schema_message(TABLE.schema)),
                                   encode_flight_data(b"", put_options(use_deephaven_nulls=True)),
                                   encode_flight_data(b"")])
def test_a_first_message_without_descriptor_is_refused(first):
    assert str(refused(UploadDecoder(), first)) == "Result flight descriptor never provided"


@pytest.mark.parametrize("metadata", [b"junk", b"", barrage.BarrageMessageWrapper(msg_type=6, payload=b"").to_bytes()])
def test_bad_options(metadata):
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", None, descriptor=DESC))
    assert str(refused(d, encode_flight_data(b"", metadata))).startswith("bad DoPut options: ")


def test_bad_arrow_message_header():
    d = opened()
    assert str(refused(d, encode_flight_data(b"\x01\x02\x03\x04\x05\x06\x07\x08\x09"))).startswith(
        "bad Arrow message header: ")


def test_a_second_schema_is_refused():
    d = opened()
    assert str(refused(d, encode_flight_data(schema_message(TABLE.schema)))) == "DoPut: a second schema message"


def test_a_schema_without_wire_mapping_is_refused():
    schema = pa.schema([("d", pa.dictionary(pa.int32(), pa.string())), ("x", pa.int64())])
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", None, descriptor=DESC))
    err = refused(d, encode_flight_data(schema_message(schema)))
    assert str(err).startswith("DoPut: ") and "column 'd'" in str(err) and "dictionary" in str(err)


def test_a_non_utf8_field_name_is_refused():
    good = schema_message(pa.schema([("ab", pa.int64())]))
    bad = good.replace(b"ab", b"\xff\xfe")
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", None, descriptor=DESC))
    err = refused(d, encode_flight_data(bad))
    assert "UTF-8" in str(err)


def test_a_list_upload_whose_schema_is_not_wrapped_is_refused():
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", put_options(columns_as_list=True), descriptor=DESC))
    err = refused(d, encode_flight_data(schema_message(TABLE.schema)))
    assert str(err) == "column 'x' is not list-wrapped (int64)"


def test_keys_metadata_that_is_not_utf8():
    schema = TABLE.schema.with_metadata({KEYS_METADATA: b"\xff\xfe"})
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", None, descriptor=DESC))
    assert str(refused(d, encode_flight_data(schema_message(schema)))) == (
        "DoPut: schema metadata 'tickwire:keys' is not UTF-8")


def test_keys_metadata_naming_columns_not_in_the_schema():
    schema = TABLE.schema.with_metadata({KEYS_METADATA: b"x,nope,y" + b"z" * 100})
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", None, descriptor=DESC))
    err = refused(d, encode_flight_data(schema_message(schema)))
    assert str(err) == f"DoPut: 'tickwire:keys' names 2 column(s) not in the schema: 'nope', {('y' + 'z' * 63)!r}"
    assert d.schema is None


def test_a_dictionary_batch_is_refused():
    d = opened()
    # the same message with header type DictionaryBatch: read_message_header needs its own layout,
    # so build one from pyarrow's stream of a dictionary column
    dict_table = pa.table({"d": pa.array(["a", "b"]).dictionary_encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, dict_table.schema) as w:
        w.write_table(dict_table)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    reader.read_next_message()  # schema
    dictionary = reader.read_next_message()
    msg = encode_flight_data(dictionary.metadata.to_pybytes(), None, body=dictionary.body.to_pybytes())
    assert str(refused(d, msg)) == "DoPut: unsupported Arrow message type 2"


def test_a_batch_before_the_schema_is_refused():
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", None, descriptor=DESC))
    assert str(refused(d, put_batches(TABLE)[0])) == "Schema must be processed before record-batch messages"


def test_a_batch_with_a_truncated_body_is_refused_when_decoded():
    d = opened()
    enc = encode_record_batch([c.combine_chunks() for c in TABLE.columns], [f.type for f in TABLE.schema])
    body = b"".join(bytes(p) for p in enc.body_parts)
    for bad in (body[: len(body) // 3], b""):
        (batch,) = d.feed(encode_flight_data(enc.header, None, body=bad))
        with pytest.raises(UploadError) as e:
            batch.decode()
        assert str(e.value).startswith("bad record batch: ") and e.value.code == "INVALID_ARGUMENT"


def test_columns_of_different_lengths_are_refused_when_decoded():
    enc = encode_record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", "b", "c"])], [pa.int64(), pa.string()])
    err = batch_refusal(opened(), encode_flight_data(enc.header, None, body_parts=enc.body_parts))
    assert str(err) == "DoPut record batch columns have different lengths [2, 3]"


@pytest.mark.parametrize("column", [
    pa.array([datetime.datetime(3000, 1, 1)], pa.timestamp("us")),
    pa.array([datetime.timedelta(days=365 * 400)], pa.duration("us")),
])
def test_values_that_do_not_fit_in_nanoseconds_are_refused_when_decoded(column):
    t = pa.table({"v": column})
    err = batch_refusal(opened(t.schema), put_batches(t)[0])
    assert str(err).startswith("DoPut column 'v': ")


def test_close_without_descriptor_or_schema():
    with pytest.raises(UploadError) as e:
        UploadDecoder().close()
    assert str(e.value) == "Result flight descriptor never provided" and e.value.code == "INVALID_ARGUMENT"
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", None, descriptor=DESC))
    with pytest.raises(UploadError) as e:
        d.close()
    assert str(e.value) == "DoPut: schema never provided" and e.value.code == "INVALID_ARGUMENT"


def test_nothing_is_accepted_after_a_refusal_or_the_end():
    d = UploadDecoder()
    refused(d, b"\x0a\xff")
    with pytest.raises(UploadError, match="after the end of the upload"):
        d.feed(encode_flight_data(b"", None, descriptor=DESC))
    d = opened()
    d.close()
    with pytest.raises(UploadError, match="after the end of the upload"):
        d.feed(put_batches(TABLE)[0])


# -- maps, unions, list_views and nulls ---------------------------------------------------------------------------

def _sparse(codes, members, names):
    return pa.UnionArray.from_sparse(pa.array(codes, pa.int8()), members, names)


KEPT = pa.table({
    "m": pa.array([[("a", 1)], None, [("b", -(2**31))]], pa.map_(pa.string(), pa.int32())),
    "d": pa.UnionArray.from_dense(pa.array([3, 9, 3], pa.int8()), pa.array([0, 0, 1], pa.int32()),
                                  [pa.array([1, -(2**31)], pa.int32()), pa.array(["x"])], ["i", "s"], [3, 9]),
    "u": _sparse([0, 1, 1], [pa.array([65535, 2, 3], pa.uint16()), pa.array(["x", "y", None])], ["c", "s"]),
    "lv": pa.array([[1, -(2**31)], None, []], pa.list_view(pa.int32())),
    "n": pa.nulls(3),
})
KEPT_READ = {"m": [[("a", 1)], None, [("b", None)]], "d": [1, "x", None], "u": [None, "y", None],
             "lv": [[1, None], None, []], "n": [None, None, None]}


@pytest.mark.parametrize("as_list", [False, True])
def test_maps_unions_list_views_and_nulls_are_accepted_with_their_types(as_list):
    d = UploadDecoder()
    evs = events(d, put_opening(PATH, KEPT.schema, columns_as_list=as_list))
    assert evs[-1].schema == KEPT.schema
    batches = events(d, put_batches(KEPT, columns_as_list=as_list)
                     + put_batches(KEPT.slice(1), columns_as_list=as_list))
    first, second = (b.decode() for b in batches)
    assert first.schema == KEPT.schema
    # sentinels of map values, list_view elements and union members read as null, as Deephaven reads them
    assert first.to_pydict() == KEPT_READ
    assert second.to_pydict() == {k: v[1:] for k, v in KEPT_READ.items()}


@pytest.mark.parametrize("t, within", [
    (pa.large_list_view(pa.int32()), None),
    (pa.large_list(pa.int32()), None),
    (pa.large_string(), None),
    (pa.list_(pa.decimal32(5, 1)), pa.decimal32(5, 1)),
    (pa.list_view(pa.large_binary()), pa.large_binary()),
    (pa.map_(pa.string(), pa.decimal64(12, 2)), pa.decimal64(12, 2)),
    (pa.sparse_union([pa.field("a", pa.int32()), pa.field("b", pa.decimal32(4, 0))]), pa.decimal32(4, 0)),
])
def test_types_deephaven_refuses_are_refused_at_any_depth(t, within):
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", None, descriptor=DESC))
    err = refused(d, encode_flight_data(schema_message(pa.schema([("c", t)]))))
    assert str(err).startswith(f"DoPut: column 'c' has type {t}")
    assert "which Deephaven does not accept on DoPut" in str(err)
    if within is not None:
        assert f"whose {within}" in str(err)


@pytest.mark.parametrize("t", [
    pa.list_(pa.struct([("a", pa.int32())])),
    pa.map_(pa.string(), pa.struct([("a", pa.int32())])),
    pa.sparse_union([pa.field("a", pa.struct([("x", pa.int32())]))]),
    pa.dense_union([pa.field("a", pa.dictionary(pa.int8(), pa.string()))]),
])
def test_structs_and_dictionaries_inside_are_refused(t):
    d = UploadDecoder()
    d.feed(encode_flight_data(b"", None, descriptor=DESC))
    err = refused(d, encode_flight_data(schema_message(pa.schema([("c", t)]))))
    assert str(err).startswith(f"DoPut: column 'c' has type {t}, which cannot be served")


def test_a_refusal_in_the_first_message_keeps_the_destination():
    """The destination is read before the schema in the same message is refused (the server fails
    the export it names with the refusal)."""
    d = UploadDecoder()
    (opening,) = put_opening(["export", "7"], pa.schema([("c", pa.large_list_view(pa.int8()))]))
    refused(d, opening)
    assert d.path == ["export", "7"]
