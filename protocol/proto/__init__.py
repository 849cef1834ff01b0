# GENERATED CODE: written by proto/generate.py from proto/*.proto with grpcio-tools 1.85.1 (libprotoc 35.1). Do not edit.
"""Protobuf message classes for Arrow Flight and Deephaven's gRPC services (sources in proto/).

Modules: flight_pb2 (package arrow.flight.protocol), ticket_pb2, config_pb2, session_pb2,
table_pb2, application_pb2 (package io.deephaven.proto.backplane.grpc). The wire format, full
gRPC method names, message names and field numbers are those of Arrow and Deephaven.

All descriptors live in POOL, a descriptor pool private to tickwire, so these modules can be
imported in the same process as Deephaven's own generated modules (which use protobuf's default
pool and define the same message names). Messages of the two sets are distinct Python classes;
they interoperate through bytes (SerializeToString / FromString).
"""
from google.protobuf import any_pb2 as _any_pb2
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import timestamp_pb2 as _timestamp_pb2

POOL = _descriptor_pool.DescriptorPool()
POOL.AddSerializedFile(_any_pb2.DESCRIPTOR.serialized_pb)
POOL.AddSerializedFile(_timestamp_pb2.DESCRIPTOR.serialized_pb)
