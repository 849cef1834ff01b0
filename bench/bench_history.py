"""History tables (tickwire.server.engine.storage.history, .parquet): a Hive-partitioned Parquet
dataset of --rows rows (default 1,000,000,000; 10,000,000 with --quick) served as one table, its
column data read per row group on demand.

The dataset (built once, kept under bench/.cache/history-<rows>/ and reused when its completion
marker `_COMPLETE.json` says it was built with the same layout) is partitioned by `Date`
(`Date=2026-01-01/part-0.parquet` ..., --dates of them, 100 by default), one file per date, row
groups of --row-group rows (1M), columns Sym (string, 8 values), Px (float64, a random walk on a
cent grid) and Qty (int64, 100 values): compressible, about 2.2 bytes a row. Each file is written
one row group at a time (ParquetWriter), so the build holds one row group in memory; every row
group's values come from a seed of its own, so the benchmark can check any row it reads. An
interrupted build resumes at the first date whose file is missing. Free disk is checked first.

The tickwire server runs in a child process of its own (its memory is the server's alone); this
process is the client. Measured and printed:

1. Start to serving: from spawning the child (interpreter start and imports included) through
   Engine(), engine.history("trades", <dataset>), TickwireServer(...).start() to the first answer
   about the table (GetSchema of `trades` through pyarrow.flight), with the child's own
   breakdown. Target < 5 s. A DoGet of the whole table sends its schema only after reading every
   row (the DoGet snapshot is gathered before its first message), so it cannot be the "first answer"
   of a history table; with rows <= --full-doget-max (20M) the benchmark measures that DoGet at the
   end, to show what it costs.
2. The child's resident size (VmRSS of /proc/self/status) after the start. Target < 500 MB.
3. A 60-row viewport snapshot (all columns) at 5 random positions through tickwire's Barrage client
   (tickwire.clients.client.BarrageClient.snapshot): ms each, checked against the generated
   values, with the (location, row group) pairs and column chunks it read (ParquetRows.stats).
   Target < 100 ms for those after the first. Then the resident size again.
4. A filter on the partitioning column, engine-level (`t.where(pc.field("Date") == d)`, named
   `trades_day`): Parquet column chunks read while making it (target 0) and its size (= the date's
   rows).
5. DoGet of that one date (one Parquet file) with a pyarrow.flight client: tickwire (`s/trades_day`)
   against a pyarrow.flight C++ server (FlightServerBase, in a child process of its own) whose
   do_get reads the same file (ParquetFile.read, per request) and answers a RecordBatchStream of it
   in 64K-row batches, the Date column added. Runs alternate; medians; rows/s of each and the ratio
   tickwire / reference (target >= 1.0), server CPU per DoGet, the resident size after.

Exits non-zero on errors (a wrong value read back, a failed call, not enough disk), not on a missed
target. The data under bench/.cache/ is not removed (delete it by hand; about 2.2 GB at 1e9 rows).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from procstat import cpu_seconds

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
SEED = 20260101
SYMS = ["AAPL", "MSFT", "GOOG", "AMZN", "META", "NVDA", "TSLA", "NFLX"]
FIRST_DATE = _dt.date(2026, 1, 1)
VIEWPORT_ROWS = 60
BATCH_ROWS = 64 * 1024
EST_BYTES_PER_ROW = 3.0  # what the free disk is checked against (the build measures ~2.2)
MARKER = "_COMPLETE.json"  # written last; underscore files are not locations
FORMAT_VERSION = 1
REPLY = "@@"  # the child's replies start with it (anything else on its stdout is passed through)


# -- the dataset ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    rows: int
    dates: int
    rg_rows: int
    seed: int = SEED
    version: int = FORMAT_VERSION

    def date_rows(self, d: int) -> int:
        return self.rows // self.dates + (1 if d < self.rows % self.dates else 0)

    def date_start(self, d: int) -> int:
        return d * (self.rows // self.dates) + min(d, self.rows % self.dates)

    def date_name(self, d: int) -> str:
        return (FIRST_DATE + _dt.timedelta(days=d)).isoformat()

    def rg_sizes(self, d: int) -> list[int]:
        n = self.date_rows(d)
        sizes = [self.rg_rows] * (n // self.rg_rows)
        if n % self.rg_rows:
            sizes.append(n % self.rg_rows)
        return sizes

    def locate(self, pos: int) -> tuple[int, int]:
        """(date, row within the date) of a position of the table."""
        base, rem = divmod(self.rows, self.dates)
        big = rem * (base + 1)
        if pos < big:
            return pos // (base + 1), pos % (base + 1)
        return rem + (pos - big) // base, (pos - big) % base

    def file(self, root: Path, d: int) -> Path:
        return root / f"Date={self.date_name(d)}" / "part-0.parquet"


def data_schema():
    import pyarrow as pa
    return pa.schema([("Sym", pa.string()), ("Px", pa.float64()), ("Qty", pa.int64())])


def row_group_table(layout: Layout, d: int, rg: int, n: int):
    """The values of row group `rg` of date `d` (n rows), from a seed of its own."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng([layout.seed, d, rg])
    sym = pa.array(SYMS, pa.string()).take(pa.array(rng.integers(0, len(SYMS), n, dtype=np.int32)))
    walk = np.cumsum(rng.integers(-1, 2, n, dtype=np.int8), dtype=np.int64)
    np.clip(walk, -2500, 2500, out=walk)
    px = (10_000 + (d * 37 + rg * 11) % 5000 + walk) / 100.0
    qty = rng.integers(1, 101, n, dtype=np.int64) * 100
    return pa.table({"Sym": sym, "Px": px, "Qty": qty}, schema=data_schema())


def expected_rows(layout: Layout, first: int, last: int):
    """The table's rows at positions first..last (inclusive), Date included."""
    import pyarrow as pa

    parts = []
    pos = first
    while pos <= last:
        d, local = layout.locate(pos)
        rg, off = divmod(local, layout.rg_rows)
        n = layout.rg_sizes(d)[rg]
        take = min(n - off, last - pos + 1)
        t = row_group_table(layout, d, rg, n).slice(off, take)
        parts.append(t.append_column("Date", pa.repeat(pa.scalar(layout.date_name(d), pa.string()), take)))
        pos += take
    return pa.concat_tables(parts)


def dataset_dir(layout: Layout, default_dates: int, default_rg: int) -> Path:
    name = f"history-{layout.rows}"
    if layout.dates != default_dates or layout.rg_rows != default_rg:
        name += f"-d{layout.dates}-rg{layout.rg_rows}"
    return CACHE / name


def _file_complete(layout: Layout, path: Path, d: int) -> bool:
    import pyarrow.parquet as pq
    try:
        md = pq.ParquetFile(path).metadata
    except Exception:  # noqa: BLE001 - a partial or corrupt file is rebuilt
        return False
    return md.num_rows == layout.date_rows(d) and \
        [md.row_group(i).num_rows for i in range(md.num_row_groups)] == layout.rg_sizes(d)


def ensure_dataset(layout: Layout, root: Path) -> tuple[bool, float]:
    """Builds the dataset at `root` unless a complete one is there; (built now, seconds)."""
    import pyarrow.parquet as pq

    marker = root / MARKER
    if marker.exists():
        try:
            if json.loads(marker.read_text()) == asdict(layout):
                return False, 0.0
        except ValueError:
            pass
        print(f"{root}: built with another layout; removing it", flush=True)
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    todo = [d for d in range(layout.dates) if not _file_complete(layout, layout.file(root, d), d)]
    remaining = sum(layout.date_rows(d) for d in todo)
    need = int(remaining * EST_BYTES_PER_ROW * 1.2) + (512 << 20)
    free = shutil.disk_usage(root).free
    if free < need:
        raise SystemExit(f"not enough disk for the dataset at {root}: {remaining:,} rows to write need about "
                         f"{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free (use --rows for a smaller one)")
    print(f"building {root}: {layout.rows:,} rows in {layout.dates} dates, row groups of {layout.rg_rows:,} "
          f"({len(todo)} files to write, about {remaining * 2.2 / 1e9:.1f} GB; {free / 1e9:.0f} GB free)", flush=True)
    t0 = time.perf_counter()
    done_rows = 0
    last_print = t0
    for k, d in enumerate(todo):
        path = layout.file(root, d)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.tmp"  # hidden: never a location
        with pq.ParquetWriter(tmp, data_schema(), compression="snappy") as w:
            for rg, n in enumerate(layout.rg_sizes(d)):
                w.write_table(row_group_table(layout, d, rg, n), row_group_size=layout.rg_rows)
        os.replace(tmp, path)
        done_rows += layout.date_rows(d)
        now = time.perf_counter()
        if now - last_print > 10 or k == len(todo) - 1:
            last_print = now
            print(f"  {k + 1}/{len(todo)} files, {done_rows:,} rows, {done_rows / (now - t0) / 1e6:.1f} M rows/s",
                  flush=True)
    marker.write_text(json.dumps(asdict(layout)))
    return True, time.perf_counter() - t0


def dir_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.parquet"))


# -- the child processes ----------------------------------------------------------------------------
def rss_kb() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":", 1)
                out[k] = int(v.split()[0])
    return out


def reply(obj: dict) -> None:
    sys.stdout.write(REPLY + json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve_tickwire(root: str, cache_mb: int) -> None:
    t_enter = time.monotonic()
    import pyarrow.compute as pc

    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine
    t_imports = time.monotonic()
    engine = Engine()
    t_engine = time.monotonic()
    table = engine.history("trades", root, cache_bytes=cache_mb << 20)
    t_history = time.monotonic()
    server = TickwireServer(engine, port=0).start()
    t_server = time.monotonic()
    reply({"port": server.port, "t_enter": t_enter, "t_imports": t_imports, "t_engine": t_engine,
           "t_history": t_history, "t_server": t_server, "size": table.size,
           "locations": len(table.history.locations)})
    h = table.history

    def state() -> dict:
        s = h.stats
        return {"rss": rss_kb(), "chunks_read": s.chunks_read, "bytes_read": s.bytes_read, "cache_hits": s.cache_hits,
                "reads": [list(r) for r in s.reads], "cached_bytes": h.cached_bytes()}

    try:
        for line in sys.stdin:
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "state":
                reply(state())
            elif op == "where":
                before = h.stats.chunks_read
                t0 = time.perf_counter()
                w = table.where(pc.field("Date") == cmd["date"], name=cmd["name"])
                seconds = time.perf_counter() - t0
                reply({"size": w.size, "chunks_during": h.stats.chunks_read - before, "seconds": seconds,
                       "ranges": len(w.rowset.ranges()), **state()})
            elif op == "quit":
                break
    finally:
        server.stop()
        engine.stop()


def serve_reference(path: str, date: str) -> None:
    import pyarrow as pa
    import pyarrow.flight as fl
    import pyarrow.parquet as pq

    class Reference(fl.FlightServerBase):
        def do_get(self, context, ticket):
            t = pq.ParquetFile(path).read()
            t = t.append_column("Date", pa.repeat(pa.scalar(date, pa.string()), t.num_rows))
            return fl.RecordBatchStream(pa.RecordBatchReader.from_batches(t.schema, t.to_batches(BATCH_ROWS)))

    server = Reference("grpc://127.0.0.1:0")
    reply({"port": server.port})
    sys.stdin.read()
    server.shutdown()


class Child:
    """A child process of this script (`args` its flags), spoken to by JSON lines."""

    def __init__(self, args: list[str]):
        self.spawned = time.monotonic()
        self.args = args
        self.proc = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.hello = self.read()

    def read(self) -> dict:
        while True:
            line = self.stdout.readline()
            if not line:
                raise RuntimeError(f"child {self.args[:2]} ended (exit code {self.proc.poll()})")
            if line.startswith(REPLY):
                return dict(json.loads(line[len(REPLY):]))
            sys.stdout.write(line)

    def send(self, **cmd) -> None:
        self.stdin.write(json.dumps(cmd) + "\n")
        self.stdin.flush()

    def ask(self, **cmd) -> dict:
        self.send(**cmd)
        return self.read()

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def close(self, quit_cmd: bool) -> None:
        try:
            if quit_cmd and self.proc.poll() is None:
                self.send(op="quit")
            self.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- the measurements -------------------------------------------------------------------------------
def mb(kb: int) -> float:
    return kb / 1024


def same(got, want) -> bool:
    """Equal values column by column, by name (column order, schema metadata and chunking aside)."""
    if got.num_rows != want.num_rows or sorted(got.column_names) != sorted(want.column_names):
        return False
    return all(got.column(n).combine_chunks().equals(want.column(n).combine_chunks()) for n in want.column_names)


def run(args, layout: Layout, root: Path) -> int:
    import numpy as np
    import pyarrow.flight as fl

    from tickwire.clients.client import BarrageClient

    anon = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")], timeout=3600)
    summary: list[tuple[str, str, str, str]] = []  # (measure, value, target, met)
    failures: list[str] = []

    def row(name, value, target="", met=None):
        summary.append((name, value, target, "" if met is None else ("yes" if met else "NO")))

    rng = np.random.default_rng(args.seed)
    tw = Child(["--serve", str(root), "--cache-mb", str(args.cache_mb)])
    ref = None
    try:
        h = tw.hello
        port = h["port"]
        client = fl.FlightClient(f"grpc://127.0.0.1:{port}")
        schema = client.get_schema(fl.FlightDescriptor.for_path("scope", "trades"), anon).schema
        t_serving = time.monotonic()
        if sorted(schema.names) != ["Date", "Px", "Qty", "Sym"]:
            raise RuntimeError(f"unexpected schema {schema}")
        if h["size"] != layout.rows:
            raise RuntimeError(f"table size {h['size']:,} != {layout.rows:,}")
        total = t_serving - tw.spawned
        print(f"\n1. start to serving: {total:.2f} s from spawning the server process to GetSchema of `trades` "
              f"answered (target < 5 s)")
        print(f"   interpreter start {h['t_enter'] - tw.spawned:.2f} s, imports {h['t_imports'] - h['t_enter']:.2f} s, "
              f"Engine() {h['t_engine'] - h['t_imports']:.2f} s, engine.history {h['t_history'] - h['t_engine']:.2f} s "
              f"({h['locations']} locations, {h['size']:,} rows), TickwireServer.start "
              f"{h['t_server'] - h['t_history']:.2f} s, first GetSchema {t_serving - h['t_server']:.3f} s")
        row("start to serving (spawn .. GetSchema)", f"{total:.2f} s", "< 5 s", total < 5)
        row("  of which engine.history", f"{h['t_history'] - h['t_engine']:.2f} s")

        st = tw.ask(op="state")
        rss_start = st["rss"]["VmRSS"]
        print(f"\n2. server RSS after start: {mb(rss_start):.0f} MB (target < 500 MB); column chunks read so far: "
              f"{st['chunks_read']}")
        row("RSS after start", f"{mb(rss_start):.0f} MB", "< 500 MB", mb(rss_start) < 500)
        row("chunks read by the start", str(st["chunks_read"]), "0", st["chunks_read"] == 0)

        # 3. viewports
        positions = [int(p) for p in rng.integers(0, layout.rows - VIEWPORT_ROWS + 1, args.viewports)]
        print(f"\n3. {VIEWPORT_ROWS}-row viewport snapshots (all 4 columns) through BarrageClient.snapshot at "
              f"{len(positions)} random positions")
        bc = BarrageClient(f"grpc://127.0.0.1:{port}")
        times: list[float] = []
        again: list[float] = []
        t_first_vp = None
        try:
            for i, p in enumerate(positions):
                before = tw.ask(op="state")
                t0 = time.perf_counter()
                got = bc.snapshot("trades", viewport=[(p, p + VIEWPORT_ROWS - 1)])
                dt = time.perf_counter() - t0
                if t_first_vp is None:
                    t_first_vp = time.monotonic() - tw.spawned
                after = tw.ask(op="state")
                want = expected_rows(layout, p, p + VIEWPORT_ROWS - 1)
                ok = same(got, want)
                if not ok:
                    failures.append(f"viewport at {p:,}: values differ from the generated ones")
                # reference: the same viewport again, its column chunks now in the cache
                t0 = time.perf_counter()
                bc.snapshot("trades", viewport=[(p, p + VIEWPORT_ROWS - 1)])
                again.append(time.perf_counter() - t0)
                d, local = layout.locate(p)
                times.append(dt)
                print(f"   #{i + 1} rows {p:,}..{p + VIEWPORT_ROWS - 1:,} (date {layout.date_name(d)}, row group "
                      f"{local // layout.rg_rows}): {dt * 1e3:7.1f} ms (again, cached: {again[-1] * 1e3:.1f} ms); "
                      f"read row groups (location, rg) {after['reads']}, "
                      f"{after['chunks_read'] - before['chunks_read']} column chunks "
                      f"({(after['bytes_read'] - before['bytes_read']) / 1e6:.1f} MB decoded), "
                      f"{'values checked' if ok else 'VALUES DIFFER'}")
        finally:
            bc.close()
        later = times[1:] or times
        med = statistics.median(later)
        print(f"   after the first: median {med * 1e3:.1f} ms, max {max(later) * 1e3:.1f} ms (target < 100 ms); "
              f"first {times[0] * 1e3:.1f} ms; spawn to first viewport answered {t_first_vp:.2f} s")
        print(f"   reference, the same viewports again from the chunk cache: median "
              f"{statistics.median(again[1:] or again) * 1e3:.1f} ms; ratio first-read / cached (after the first) "
              f"{med / statistics.median(again[1:] or again):.2f}")
        row("viewport 60 rows, first", f"{times[0] * 1e3:.0f} ms")
        row("viewport 60 rows, after the first (max)", f"{max(later) * 1e3:.0f} ms", "< 100 ms", max(later) < 0.1)
        row("viewport 60 rows, same again (cached, median)", f"{statistics.median(again[1:] or again) * 1e3:.0f} ms")
        st = tw.ask(op="state")
        rss_vp = st["rss"]["VmRSS"]
        print(f"   server RSS after the viewports: {mb(rss_vp):.0f} MB (+{mb(rss_vp - rss_start):.0f} MB); chunk cache "
              f"{st['cached_bytes'] / 2**20:.0f} MiB (bound {args.cache_mb} MiB); "
              f"{st['chunks_read']} chunks read in all")
        row("RSS after viewports", f"{mb(rss_vp):.0f} MB", "< 500 MB", mb(rss_vp) < 500)

        # 4. a filter on the partitioning column
        day = int(rng.integers(0, layout.dates))
        date = layout.date_name(day)
        w = tw.ask(op="where", date=date, name="trades_day")
        ok = w["size"] == layout.date_rows(day)
        print(f"\n4. t.where(Date == {date!r}): {w['seconds'] * 1e3:.1f} ms, size {w['size']:,} (the date's rows: "
              f"{layout.date_rows(day):,}, {'equal' if ok else 'DIFFERENT'}), {w['ranges']} key range(s), "
              f"{w['chunks_during']} column chunks read (target 0)")
        if not ok:
            failures.append(f"where Date == {date}: size {w['size']:,} != {layout.date_rows(day):,}")
        row("where Date==d: chunks read", str(w["chunks_during"]), "0", w["chunks_during"] == 0)
        row("where Date==d: size == date's rows", f"{w['size']:,}", f"{layout.date_rows(day):,}", ok)

        # 5. DoGet of that date: tickwire vs pyarrow.flight C++ server
        path = layout.file(root, day)
        ref = Child(["--serve-ref", str(path), "--date", date])
        ref_client = fl.FlightClient(f"grpc://127.0.0.1:{ref.hello['port']}")
        targets = {"tickwire": (client, b"s/trades_day", anon, tw),
                   "reference": (ref_client, b"day", fl.FlightCallOptions(timeout=3600), ref)}
        n_day = layout.date_rows(day)
        print(f"\n5. DoGet of one date ({path.relative_to(root)}: {n_day:,} rows, "
              f"{path.stat().st_size / 1e6:.0f} MB of Parquet) through a pyarrow.flight client, {args.runs} runs each, "
              f"alternating; the reference reads the file per request")
        times_d: dict[str, list[float]] = {k: [] for k in targets}
        cpu: dict[str, list[float]] = {k: [] for k in targets}
        chunks_per_get = []
        results = {}
        for r in range(args.runs):
            for k, (cl, ticket, opts, child) in targets.items():
                c0 = child.cpu_seconds()
                s0 = tw.ask(op="state")["chunks_read"] if k == "tickwire" else 0
                t0 = time.perf_counter()
                got = cl.do_get(fl.Ticket(ticket), opts).read_all()
                times_d[k].append(time.perf_counter() - t0)
                cpu[k].append(child.cpu_seconds() - c0)
                if k == "tickwire":
                    chunks_per_get.append(tw.ask(op="state")["chunks_read"] - s0)
                if got.num_rows != n_day:
                    failures.append(f"{k} DoGet: {got.num_rows:,} rows, not {n_day:,}")
                if r == 0:
                    results[k] = got
                del got
            if r == 0:
                if not same(results["tickwire"], results["reference"]):
                    failures.append("DoGet of the date: tickwire's result differs from the reference's")
                    print(f"   tickwire schema {results['tickwire'].schema}\n   reference schema "
                          f"{results['reference'].schema}")
                else:
                    print("   first runs: both results equal (values checked)")
                results.clear()
        rate = {}
        for k in targets:
            m = statistics.median(times_d[k])
            rate[k] = n_day / m
            print(f"   {k:9s}: median {m * 1e3:8.1f} ms ({', '.join(f'{x * 1e3:.0f}' for x in times_d[k])} ms), "
                  f"{rate[k] / 1e6:6.2f} M rows/s; server CPU {statistics.median(cpu[k]) * 1e3:.0f} ms per DoGet")
        ratio = rate["tickwire"] / rate["reference"]
        print(f"   tickwire column chunks read per DoGet: {chunks_per_get}")
        print(f"   DoGet throughput ratio tickwire / pyarrow.flight C++ server: {ratio:.2f} (target >= 1.0)")
        row("DoGet one date, tickwire", f"{rate['tickwire'] / 1e6:.2f} M rows/s")
        row("DoGet one date, pyarrow.flight C++", f"{rate['reference'] / 1e6:.2f} M rows/s")
        row("DoGet ratio tickwire / reference", f"{ratio:.2f}", ">= 1.0", ratio >= 1.0)
        st = tw.ask(op="state")
        rss_get = st["rss"]["VmRSS"]
        print(f"   server RSS after the DoGets: {mb(rss_get):.0f} MB (peak so far {mb(st['rss']['VmHWM']):.0f} MB); "
              f"chunk cache {st['cached_bytes'] / 2**20:.0f} MiB")
        row("RSS after DoGets (peak)", f"{mb(rss_get):.0f} MB ({mb(st['rss']['VmHWM']):.0f} MB)")

        # 6. the whole table by DoGet, small sizes only
        if layout.rows <= args.full_doget_max:
            s0 = st["chunks_read"]
            t0 = time.perf_counter()
            reader = client.do_get(fl.Ticket(b"s/trades"), anon)
            _ = reader.schema
            t_schema = time.perf_counter() - t0
            n = reader.read_all().num_rows
            t_all = time.perf_counter() - t0
            st = tw.ask(op="state")
            print(f"\n6. DoGet of the whole table `trades` ({layout.rows:,} rows): schema after {t_schema:.2f} s, "
                  f"{n:,} rows after {t_all:.2f} s; {st['chunks_read'] - s0} column chunks read; server RSS "
                  f"{mb(st['rss']['VmRSS']):.0f} MB (peak {mb(st['rss']['VmHWM']):.0f} MB). The rows are read and "
                  f"sent a piece at a time (ServerConfig.doget_piece_rows): memory follows a piece, not the table.")
            row("DoGet whole table: time to schema", f"{t_schema:.2f} s")
            if n != layout.rows:
                failures.append(f"DoGet of trades: {n:,} rows, not {layout.rows:,}")
        else:
            print(f"\n6. DoGet of the whole table skipped ({layout.rows:,} rows > --full-doget-max "
                  f"{args.full_doget_max:,}): at about 10 M rows/s it would take minutes")
    finally:
        tw.close(quit_cmd=True)
        if ref is not None:
            ref.close(quit_cmd=False)

    print(f"\nsummary ({layout.rows:,} rows, {layout.dates} dates, row groups of {layout.rg_rows:,}):")
    w1 = max(len(r[0]) for r in summary)
    w2 = max(len(r[1]) for r in summary)
    w3 = max(len(r[2]) for r in summary)
    print(f"  {'measure':{w1}s}  {'value':>{w2}s}  {'target':{w3}s}  met")
    for name, value, target, met in summary:
        print(f"  {name:{w1}s}  {value:>{w2}s}  {target:{w3}s}  {met}")
    for f in failures:
        print(f"ERROR: {f}", file=sys.stderr)
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="rows of the dataset (default 1,000,000,000)")
    ap.add_argument("--quick", action="store_true", help="10,000,000 rows (unless --rows) and 3 DoGet runs")
    ap.add_argument("--dates", type=int, default=100, help="dates (Parquet files) of the dataset")
    ap.add_argument("--row-group", type=int, default=1_000_000, help="rows per row group")
    ap.add_argument("--runs", type=int, default=None, help="DoGet runs of each server (default 5, 3 with --quick)")
    ap.add_argument("--viewports", type=int, default=5)
    ap.add_argument("--cache-mb", type=int, default=256, help="the history table's chunk cache (tickwire's default)")
    ap.add_argument("--full-doget-max", type=int, default=20_000_000,
                    help="DoGet the whole table too when it has at most this many rows")
    ap.add_argument("--seed", type=int, default=7, help="picks the viewport positions and the date")
    ap.add_argument("--build-only", action="store_true", help="build (or check) the dataset and stop")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--serve-ref", help=argparse.SUPPRESS)
    ap.add_argument("--date", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_tickwire(args.serve, args.cache_mb)
        return 0
    if args.serve_ref:
        serve_reference(args.serve_ref, args.date)
        return 0
    rows = args.rows if args.rows is not None else (10_000_000 if args.quick else 1_000_000_000)
    args.runs = args.runs if args.runs is not None else (3 if args.quick else 5)
    if rows < args.dates or rows < VIEWPORT_ROWS:
        ap.error(f"--rows must be at least --dates ({args.dates}) and {VIEWPORT_ROWS}")
    layout = Layout(rows, args.dates, args.row_group)
    root = dataset_dir(layout, 100, 1_000_000)
    built, seconds = ensure_dataset(layout, root)
    size = dir_bytes(root)
    print(f"dataset {root}: {rows:,} rows, {layout.dates} files, {size / 1e9:.2f} GB "
          f"({size / rows:.2f} bytes a row); " + (f"built in {seconds:.0f} s ({rows / seconds / 1e6:.1f} M rows/s)"
                                                  if built else "reused"), flush=True)
    if args.build_only:
        return 0
    return run(args, layout, root)


if __name__ == "__main__":
    sys.exit(main())
