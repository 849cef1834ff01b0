"""N subscribers that never read: `python stalled_clients.py TARGET N` subscribes N times to the
table `big` of the server at TARGET, each on its own channel without BDP probing (the HTTP/2
window stays at 64 KiB, so the server keeps whatever is not read), prints `subscribed` and holds
the calls open until its stdin closes. `start(target, n)` runs it and returns once they are
subscribed. Used by tests/test_hostile_requests.py and bench/bench_memory.py.
"""
import os
import queue
import subprocess
import sys

import grpc

from tickwire.protocol import barrage
from tickwire.protocol.flight import encode_flight_data


def start(target: str, n: int) -> subprocess.Popen:
    """Runs this script for `n` stalled subscribers of `target`; returns once they have subscribed
    (closing the process's stdin ends them)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, __file__, target, str(n)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env=env)
    assert p.stdout is not None
    if p.stdout.readline().strip() != b"subscribed":
        p.kill()
        raise RuntimeError(f"the stalled clients did not subscribe to {target}")
    return p


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
