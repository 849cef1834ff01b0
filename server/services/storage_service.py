"""Deephaven's StorageService, where the web UI keeps layouts and notebooks. tickwire stores
nothing: ListItems answers every directory as empty (Deephaven's grid page lists "*.json" at the
root before it shows a table); the other methods answer UNIMPLEMENTED (stubs from the method
table, after the credentials check)."""
from __future__ import annotations

import posixpath

from tickwire.protocol.proto import storage_pb2
from tickwire.protocol.proto.methods import STORAGE_SERVICE
from tickwire.server.services.context import ServerContext
from tickwire.server.services.rpc import CallError, service_handlers

__all__ = ["StorageService", "canonical_path"]


def canonical_path(path: str) -> str:
    """The directory `path` names as Deephaven writes it back: "/" + its normalized form relative
    to the storage root ("" and "/" are the root: "/"). A path leaving the root is refused."""
    rel = path.lstrip("/")
    norm = posixpath.normpath(rel) if rel else ""
    if norm in (".", ""):
        return "/"
    if norm == ".." or norm.startswith("../"):
        raise CallError(f"Invalid path: {path!r} leaves the storage root", "INVALID_ARGUMENT")
    return "/" + norm


def _check_glob(glob: str) -> None:
    # the globs Deephaven accepts: one directory, single "*" wildcards
    if "**" in glob:
        raise CallError("Bad glob, only single `*`s are supported", "INVALID_ARGUMENT")
    if "/" in glob:
        raise CallError("Bad glob, only the same directory can be checked", "INVALID_ARGUMENT")


class StorageService:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx

    def handlers(self) -> dict:
        return service_handlers(STORAGE_SERVICE, {"ListItems": (self.list_items, None, None)})

    async def list_items(self, req, context):
        await self.ctx.authenticate(context)
        if req.HasField("filter_glob"):
            _check_glob(req.filter_glob)
        return storage_pb2.ListItemsResponse(canonical_path=canonical_path(req.path))
