"""The image's HEALTHCHECK: exit 0 when the server's grpc.health.v1 service answers SERVING."""
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main() -> int:
    target = f"127.0.0.1:{os.environ.get('TICKWIRE_PORT', '10000')}"
    try:
        with grpc.insecure_channel(target) as channel:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=3)
    except grpc.RpcError as exc:
        print(f"{target}: {exc.code().name}", file=sys.stderr)
        return 1
    serving = resp.status == health_pb2.HealthCheckResponse.SERVING
    print(f"{target}: {health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)}")
    return 0 if serving else 1


if __name__ == "__main__":
    sys.exit(main())
