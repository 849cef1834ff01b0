"""tickwire.server.services: one module per gRPC service, each building its handlers from the
method table (tickwire.protocol.proto.methods): Arrow Flight, and Deephaven's Config, Session,
Table, Application, Storage, InputTable, HierarchicalTable, Object
and BrowserFlight (uploads) services. `handlers(ctx)` gathers them all."""
from tickwire.server.services.application_service import ApplicationService
from tickwire.server.services.browser_flight_service import BrowserFlightService
from tickwire.server.services.config_service import BARRAGE_VERSION, ConfigService
from tickwire.server.services.context import ServerContext
from tickwire.server.services.flight_service import KEYS_METADATA, FlightService
from tickwire.server.services.hierarchical_table_service import HierarchicalTableService
from tickwire.server.services.input_table_service import InputTableService
from tickwire.server.services.object_service import ObjectService
from tickwire.server.services.session_service import SessionService
from tickwire.server.services.storage_service import StorageService
from tickwire.server.services.table_service import TableService

__all__ = ["FlightService", "ConfigService", "SessionService", "TableService", "ApplicationService", "StorageService",
           "InputTableService", "HierarchicalTableService", "ObjectService", "BrowserFlightService", "handlers",
           "BARRAGE_VERSION", "KEYS_METADATA"]

SERVICES = (FlightService, ConfigService, SessionService, TableService, ApplicationService, StorageService,
            InputTableService, HierarchicalTableService, ObjectService, BrowserFlightService)


def handlers(ctx: ServerContext) -> tuple[list, dict]:
    """(the service objects, {method path: handler}) for every service of the server."""
    services = [cls(ctx) for cls in SERVICES]
    out: dict = {}
    for s in services:
        for path, impl in s.handlers().items():
            if path in out:
                raise ValueError(f"{path} is served twice")
            out[path] = impl
    return services, out
