"""N subscribers that never read: `python stalled_clients.py TARGET N` subscribes N times to the
table `big` of the server at TARGET, each on its own channel without BDP probing (the HTTP/2
window stays at 64 KiB, so the server keeps whatever is not read), prints `subscribed` and holds
the calls open until its stdin closes. Used by tests/test_hostile_requests.py and
bench/bench_memory.py.
"""
import queue
import sys

import grpc

from tickwire.protocol import barrage
from tickwire.protocol.flight import encode_flight_data


def main() -> None:
    target, n = sys.argv[1], int(sys.argv[2])
    req = barrage.wrap(barrage.SubscriptionRequest(ticket=b"s/big", options=barrage.SubscriptionOptions()))
    calls = []
    for _ in range(n):
        ch = grpc.insecure_channel(target, options=[("grpc.http2.bdp_probe", 0)])
        q: queue.Queue = queue.Queue()
        call = ch.stream_stream("/arrow.flight.protocol.FlightService/DoExchange")(
            iter(q.get, None), metadata=(("authorization", "Anonymous"),))
        q.put(encode_flight_data(b"", req))
        calls.append((ch, call, q))
    print("subscribed", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
