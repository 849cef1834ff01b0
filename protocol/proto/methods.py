"""The gRPC methods tickwire serves or calls, with their message classes and streaming kind.

`METHODS` maps each full method path (``/package.Service/Method``, the HTTP/2 ``:path`` gRPC uses)
to a `Method`. Server code registers generic handlers from it and client code calls
``channel.unary_unary(path, ...)`` (or the streaming variant named by `Method.kind`) with the
serializers it gives, so neither needs generated gRPC stubs.

`ALL_METHODS` is the complete surface of the services defined in ``proto/`` (including
operations tickwire does not implement), read from the service descriptors; `METHODS` is the
hand-picked subset, and each of its entries agrees with `ALL_METHODS`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

from tickwire.errors import ProtocolError
from tickwire.protocol.proto import (
    application_pb2 as application,
)
from tickwire.protocol.proto import (
    config_pb2 as config,
)
from tickwire.protocol.proto import (
    flight_pb2 as flight,
)
from tickwire.protocol.proto import (
    hierarchicaltable_pb2 as hierarchicaltable,
)
from tickwire.protocol.proto import (
    inputtable_pb2 as inputtable,
)
from tickwire.protocol.proto import (
    object_pb2 as object_,
)
from tickwire.protocol.proto import (
    session_pb2 as session,
)
from tickwire.protocol.proto import (
    storage_pb2 as storage,
)
from tickwire.protocol.proto import (
    table_pb2 as table,
)
from tickwire.protocol.proto import (
    ticket_pb2 as ticket,
)

UNARY = "unary"
SERVER_STREAM = "server_stream"
CLIENT_STREAM = "client_stream"
BIDI = "bidi"
KINDS = (UNARY, SERVER_STREAM, CLIENT_STREAM, BIDI)

FLIGHT_SERVICE = "arrow.flight.protocol.FlightService"
CONFIG_SERVICE = "io.deephaven.proto.backplane.grpc.ConfigService"
SESSION_SERVICE = "io.deephaven.proto.backplane.grpc.SessionService"
TABLE_SERVICE = "io.deephaven.proto.backplane.grpc.TableService"
APPLICATION_SERVICE = "io.deephaven.proto.backplane.grpc.ApplicationService"
STORAGE_SERVICE = "io.deephaven.proto.backplane.grpc.StorageService"
INPUT_TABLE_SERVICE = "io.deephaven.proto.backplane.grpc.InputTableService"
HIERARCHICAL_TABLE_SERVICE = "io.deephaven.proto.backplane.grpc.HierarchicalTableService"
OBJECT_SERVICE = "io.deephaven.proto.backplane.grpc.ObjectService"
CONSOLE_SERVICE = "io.deephaven.proto.backplane.script.grpc.ConsoleService"

#: Deephaven's ConsoleService (server-side scripting), which tickwire does not have: method name ->
#: kind, as in Deephaven's console.proto (not in proto/: no message of it is ever parsed). The server
#: answers each by name (tickwire.server.services.rpc.with_stubs) instead of grpc's bare "Method not found!".
CONSOLE_METHODS: dict[str, str] = {
    "GetConsoleTypes": UNARY, "StartConsole": UNARY, "GetHeapInfo": UNARY, "SubscribeToLogs": SERVER_STREAM,
    "ExecuteCommand": UNARY, "CancelCommand": UNARY, "BindTableToVariable": UNARY, "AutoCompleteStream": BIDI,
    "CancelAutoComplete": UNARY, "OpenAutoCompleteStream": SERVER_STREAM, "NextAutoCompleteStream": UNARY,
}


@dataclass(frozen=True)
class Method:
    """One gRPC method: where it lives, how it streams, and its message classes."""

    path: str
    kind: str
    request: type[Message]
    response: type[Message]

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown method kind {self.kind!r}; expected one of {KINDS}")
        service, sep, name = self.path[1:].rpartition("/")
        if not self.path.startswith("/") or not sep or not service or not name:
            raise ValueError(f"method path {self.path!r} is not of the form /package.Service/Method")

    @property
    def service(self) -> str:
        """Full service name, e.g. ``arrow.flight.protocol.FlightService``."""
        return self.path[1:].rpartition("/")[0]

    @property
    def name(self) -> str:
        """Method name within its service, e.g. ``DoGet``."""
        return self.path.rpartition("/")[2]

    @property
    def client_streaming(self) -> bool:
        return self.kind in (CLIENT_STREAM, BIDI)

    @property
    def server_streaming(self) -> bool:
        return self.kind in (SERVER_STREAM, BIDI)

    @property
    def request_deserializer(self) -> Callable[[bytes], Message]:
        """bytes -> request message (for a server handler or a client's request side)."""
        parse: Callable[[bytes], Message] = self.request.FromString
        return parse

    @property
    def response_deserializer(self) -> Callable[[bytes], Message]:
        """bytes -> response message (for a client call)."""
        parse: Callable[[bytes], Message] = self.response.FromString
        return parse

    @staticmethod
    def serializer(message: Message) -> bytes:
        """message -> bytes, for either direction."""
        raw: bytes = message.SerializeToString()
        return raw

    def parse_request(self, payload: bytes) -> Message:
        """Parses one request message, raising ProtocolError when the bytes are not one."""
        return _parse(self.request, payload, f"{self.path} request")

    def parse_response(self, payload: bytes) -> Message:
        """Parses one response message, raising ProtocolError when the bytes are not one."""
        return _parse(self.response, payload, f"{self.path} response")


def _parse(cls: type[Message], payload: bytes, what: str) -> Message:
    try:
        return cls.FromString(payload)
    except DecodeError as e:
        raise ProtocolError(f"{what}: not a valid {cls.DESCRIPTOR.full_name} ({len(payload)} bytes): {e}") from None


def _kind(client_streaming: bool, server_streaming: bool) -> str:
    if client_streaming:
        return BIDI if server_streaming else CLIENT_STREAM
    return SERVER_STREAM if server_streaming else UNARY


def _from_descriptors() -> dict[str, Method]:
    out: dict[str, Method] = {}
    for module in (flight, config, session, table, application, ticket, storage, inputtable,
                   hierarchicaltable, object_):
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                out[f"/{service.full_name}/{m.name}"] = Method(
                    path=f"/{service.full_name}/{m.name}",
                    kind=_kind(m.client_streaming, m.server_streaming),
                    request=_class_of(m.input_type),
                    response=_class_of(m.output_type),
                )
    return out


def _class_of(descriptor: Descriptor) -> type[Message]:
    cls: type[Message] = message_factory.GetMessageClass(descriptor)
    return cls


ALL_METHODS: dict[str, Method] = _from_descriptors()


def _table(*entries: tuple[str, str, str, type[Message], type[Message]]) -> dict[str, Method]:
    out: dict[str, Method] = {}
    for service, name, kind, request, response in entries:
        path = f"/{service}/{name}"
        if path in out:
            raise ValueError(f"duplicate method {path}")
        out[path] = Method(path=path, kind=kind, request=request, response=response)
    return out


_F, _C, _S, _T, _A = FLIGHT_SERVICE, CONFIG_SERVICE, SESSION_SERVICE, TABLE_SERVICE, APPLICATION_SERVICE
_ST, _IT = STORAGE_SERVICE, INPUT_TABLE_SERVICE
_HT, _OB = HIERARCHICAL_TABLE_SERVICE, OBJECT_SERVICE
_ETCR = table.ExportedTableCreationResponse

METHODS: dict[str, Method] = _table(
    # Arrow Flight
    (_F, "Handshake", BIDI, flight.HandshakeRequest, flight.HandshakeResponse),
    (_F, "ListFlights", SERVER_STREAM, flight.Criteria, flight.FlightInfo),
    (_F, "GetFlightInfo", UNARY, flight.FlightDescriptor, flight.FlightInfo),
    (_F, "GetSchema", UNARY, flight.FlightDescriptor, flight.SchemaResult),
    (_F, "DoGet", SERVER_STREAM, flight.Ticket, flight.FlightData),
    (_F, "DoPut", BIDI, flight.FlightData, flight.PutResult),
    (_F, "DoExchange", BIDI, flight.FlightData, flight.FlightData),
    (_F, "DoAction", SERVER_STREAM, flight.Action, flight.Result),
    (_F, "ListActions", SERVER_STREAM, flight.Empty, flight.ActionType),
    # Deephaven configuration
    (_C, "GetAuthenticationConstants", UNARY, config.AuthenticationConstantsRequest,
     config.AuthenticationConstantsResponse),
    (_C, "GetConfigurationConstants", UNARY, config.ConfigurationConstantsRequest,
     config.ConfigurationConstantsResponse),
    # Deephaven sessions and exports
    (_S, "NewSession", UNARY, session.HandshakeRequest, session.HandshakeResponse),
    (_S, "RefreshSessionToken", UNARY, session.HandshakeRequest, session.HandshakeResponse),
    (_S, "CloseSession", UNARY, session.HandshakeRequest, session.CloseSessionResponse),
    (_S, "Release", UNARY, session.ReleaseRequest, session.ReleaseResponse),
    (_S, "ExportFromTicket", UNARY, session.ExportRequest, session.ExportResponse),
    (_S, "PublishFromTicket", UNARY, session.PublishRequest, session.PublishResponse),
    (_S, "ExportNotifications", SERVER_STREAM, session.ExportNotificationRequest, session.ExportNotification),
    (_S, "TerminationNotification", UNARY, session.TerminationNotificationRequest,
     session.TerminationNotificationResponse),
    # Deephaven tables
    (_T, "GetExportedTableCreationResponse", UNARY, ticket.Ticket, _ETCR),
    (_T, "FetchTable", UNARY, table.FetchTableRequest, _ETCR),
    (_T, "ApplyPreviewColumns", UNARY, table.ApplyPreviewColumnsRequest, _ETCR),
    (_T, "EmptyTable", UNARY, table.EmptyTableRequest, _ETCR),
    (_T, "TimeTable", UNARY, table.TimeTableRequest, _ETCR),
    (_T, "DropColumns", UNARY, table.DropColumnsRequest, _ETCR),
    (_T, "Update", UNARY, table.SelectOrUpdateRequest, _ETCR),
    (_T, "LazyUpdate", UNARY, table.SelectOrUpdateRequest, _ETCR),
    (_T, "View", UNARY, table.SelectOrUpdateRequest, _ETCR),
    (_T, "UpdateView", UNARY, table.SelectOrUpdateRequest, _ETCR),
    (_T, "Select", UNARY, table.SelectOrUpdateRequest, _ETCR),
    (_T, "SelectDistinct", UNARY, table.SelectDistinctRequest, _ETCR),
    (_T, "ComboAggregate", UNARY, table.ComboAggregateRequest, _ETCR),
    (_T, "AggregateAll", UNARY, table.AggregateAllRequest, _ETCR),
    (_T, "Aggregate", UNARY, table.AggregateRequest, _ETCR),
    (_T, "Filter", UNARY, table.FilterTableRequest, _ETCR),
    (_T, "UnstructuredFilter", UNARY, table.UnstructuredFilterTableRequest, _ETCR),
    (_T, "Sort", UNARY, table.SortTableRequest, _ETCR),
    (_T, "Head", UNARY, table.HeadOrTailRequest, _ETCR),
    (_T, "Tail", UNARY, table.HeadOrTailRequest, _ETCR),
    (_T, "HeadBy", UNARY, table.HeadOrTailByRequest, _ETCR),
    (_T, "TailBy", UNARY, table.HeadOrTailByRequest, _ETCR),
    (_T, "Ungroup", UNARY, table.UngroupRequest, _ETCR),
    (_T, "MergeTables", UNARY, table.MergeTablesRequest, _ETCR),
    (_T, "NaturalJoinTables", UNARY, table.NaturalJoinTablesRequest, _ETCR),
    (_T, "ExactJoinTables", UNARY, table.ExactJoinTablesRequest, _ETCR),
    (_T, "CrossJoinTables", UNARY, table.CrossJoinTablesRequest, _ETCR),
    (_T, "LeftJoinTables", UNARY, table.LeftJoinTablesRequest, _ETCR),
    (_T, "AsOfJoinTables", UNARY, table.AsOfJoinTablesRequest, _ETCR),
    (_T, "AjTables", UNARY, table.AjRajTablesRequest, _ETCR),
    (_T, "RajTables", UNARY, table.AjRajTablesRequest, _ETCR),
    (_T, "MultiJoinTables", UNARY, table.MultiJoinTablesRequest, _ETCR),
    (_T, "RangeJoinTables", UNARY, table.RangeJoinTablesRequest, _ETCR),
    (_T, "WhereIn", UNARY, table.WhereInRequest, _ETCR),
    (_T, "SnapshotWhen", UNARY, table.SnapshotWhenTableRequest, _ETCR),
    (_T, "UpdateBy", UNARY, table.UpdateByRequest, _ETCR),
    (_T, "Flatten", UNARY, table.FlattenRequest, _ETCR),
    (_T, "Slice", UNARY, table.SliceRequest, _ETCR),
    (_T, "Snapshot", UNARY, table.SnapshotTableRequest, _ETCR),
    (_T, "MetaTable", UNARY, table.MetaTableRequest, _ETCR),
    (_T, "ComputeColumnStatistics", UNARY, table.ColumnStatisticsRequest, _ETCR),
    (_T, "SeekRow", UNARY, table.SeekRowRequest, table.SeekRowResponse),
    (_T, "CreateInputTable", UNARY, table.CreateInputTableRequest, _ETCR),
    (_T, "Batch", SERVER_STREAM, table.BatchTableRequest, _ETCR),
    (_T, "ExportedTableUpdates", SERVER_STREAM, table.ExportedTableUpdatesRequest, table.ExportedTableUpdateMessage),
    # Deephaven applications and the query scope
    (_A, "ListFields", SERVER_STREAM, application.ListFieldsRequest, application.FieldsChangeUpdate),
    # Deephaven's shared storage (the web UI's layouts and notebooks): an empty listing
    (_ST, "ListItems", UNARY, storage.ListItemsRequest, storage.ListItemsResponse),
    # Deephaven's input tables: rows added to and deleted from a table made by CreateInputTable
    (_IT, "AddTableToInputTable", UNARY, inputtable.AddTableRequest, inputtable.AddTableResponse),
    (_IT, "DeleteTableFromInputTable", UNARY, inputtable.DeleteTableRequest, inputtable.DeleteTableResponse),
    # Deephaven's rollups: made, sorted and filtered, viewed with expanded rows (the view is subscribed
    # to by DoExchange), and their source exported
    (_HT, "Rollup", UNARY, hierarchicaltable.RollupRequest, hierarchicaltable.RollupResponse),
    (_HT, "Apply", UNARY, hierarchicaltable.HierarchicalTableApplyRequest,
     hierarchicaltable.HierarchicalTableApplyResponse),
    (_HT, "View", UNARY, hierarchicaltable.HierarchicalTableViewRequest,
     hierarchicaltable.HierarchicalTableViewResponse),
    (_HT, "ExportSource", UNARY, hierarchicaltable.HierarchicalTableSourceExportRequest, _ETCR),
    # Deephaven's objects that are not tables (a rollup's descriptor), fetched by typed ticket
    (_OB, "FetchObject", UNARY, object_.FetchObjectRequest, object_.FetchObjectResponse),
    (_OB, "MessageStream", BIDI, object_.StreamRequest, object_.StreamResponse),
)


def methods_of(service: str) -> dict[str, Method]:
    """The `METHODS` of one service, keyed by method name (for a generic handler per service)."""
    found = {m.name: m for m in METHODS.values() if m.service == service}
    if not found:
        raise KeyError(f"no methods of service {service!r} in METHODS")
    return found


def method(path: str) -> Method:
    """The `METHODS` entry for a full path, or KeyError naming the path."""
    try:
        return METHODS[path]
    except KeyError:
        raise KeyError(f"tickwire does not serve or call {path!r}") from None
