#!/usr/bin/env python3
"""Regenerates the protobuf message modules committed under protocol/proto/ from the .proto files here.

Usage: python proto/generate.py [--check]

The sources import each other as "tickwire/protocol/proto/<name>.proto", the path their module is
imported under (`tickwire.protocol.proto.<name>_pb2`). This script copies them into that layout in
a temporary include tree and runs `grpc_tools.protoc --python_out` (message classes only; no gRPC
stubs, so the protocol layer never imports grpc).

The generated modules register their descriptors in a private pool, `tickwire.protocol.proto.POOL`,
instead of protobuf's default pool: they declare the same protobuf packages and message names as
Deephaven's own generated code (shipped by pydeephaven as `deephaven_core.proto`), and two different
files defining `io.deephaven.proto.backplane.grpc.Ticket` cannot share one pool. The
well-known types the sources import (google/protobuf/*.proto) are added to POOL first.

Every generated file starts with a header that marks it generated. With --check, nothing is written
and the exit status says whether the committed code matches what the installed grpcio-tools
produces now. The hand-written `methods.py` next to the generated modules is left alone.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "protocol" / "proto"
PACKAGE_PATH = Path("tickwire") / "protocol" / "proto"
HEADER = "# GENERATED CODE: written by proto/generate.py from proto/{source} with {tools}. Do not edit.\n"

_DEFAULT_POOL_CALL = "_descriptor_pool.Default().AddSerializedFile("
_PRIVATE_POOL_CALL = "_POOL.AddSerializedFile("
_IMPORT_ANCHOR = "# @@protoc_insertion_point(imports)\n"
_WKT_IMPORT = re.compile(r'^import\s+"google/protobuf/(\w+)\.proto"\s*;', re.M)
_LOCAL_IMPORT = re.compile(r'^import\s+"([^"]+)"\s*;', re.M)

INIT_TEMPLATE = '''"""Protobuf message classes for Arrow Flight and Deephaven's gRPC services (sources in proto/).

Modules: flight_pb2 (package arrow.flight.protocol), ticket_pb2, config_pb2, session_pb2,
table_pb2, application_pb2 (package io.deephaven.proto.backplane.grpc). The wire format, full
gRPC method names, message names and field numbers are those of Arrow and Deephaven.

All descriptors live in POOL, a descriptor pool private to tickwire, so these modules can be
imported in the same process as Deephaven's own generated modules (which use protobuf's default
pool and define the same message names). Messages of the two sets are distinct Python classes;
they interoperate through bytes (SerializeToString / FromString).
"""
{wkt_imports}
POOL = _descriptor_pool.DescriptorPool()
{wkt_adds}'''


def tools_version() -> str:
    protoc = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "--version"],
                            check=True, capture_output=True, text=True).stdout.strip()
    return f"grpcio-tools {importlib.metadata.version('grpcio-tools')} ({protoc})"


def sources() -> list[Path]:
    found = sorted(HERE.glob("*.proto"))
    if not found:
        raise SystemExit(f"no .proto files in {HERE}")
    for src in found:
        for imp in _LOCAL_IMPORT.findall(src.read_text()):
            if imp.startswith("google/protobuf/"):
                continue
            if not imp.startswith(f"{PACKAGE_PATH.as_posix()}/") or not (HERE / Path(imp).name).exists():
                raise SystemExit(f"{src.name}: import {imp!r} must name a sibling as "
                                 f"'{PACKAGE_PATH.as_posix()}/<name>.proto'")
    return found


def well_known_types(srcs: list[Path]) -> list[str]:
    names: set[str] = set()
    for src in srcs:
        names.update(_WKT_IMPORT.findall(src.read_text()))
    return sorted(names)


def rewrite_module(text: str, source: str, tools: str) -> str:
    if text.count(_DEFAULT_POOL_CALL) != 1 or text.count(_IMPORT_ANCHOR) != 1:
        raise SystemExit(f"{source}: protoc output has an unexpected shape; cannot move it to the private pool")
    text = text.replace(_DEFAULT_POOL_CALL, _PRIVATE_POOL_CALL)
    text = text.replace(_IMPORT_ANCHOR, "from tickwire.protocol.proto import POOL as _POOL\n" + _IMPORT_ANCHOR)
    return HEADER.format(source=source, tools=tools) + text


def generate(into: Path) -> None:
    tools = tools_version()
    srcs = sources()
    import grpc_tools

    wkt_include = Path(grpc_tools.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        include = Path(tmp) / "include"
        out = Path(tmp) / "out"
        (include / PACKAGE_PATH).mkdir(parents=True)
        out.mkdir()
        for src in srcs:
            shutil.copyfile(src, include / PACKAGE_PATH / src.name)
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{include}", f"-I{wkt_include}",
               f"--python_out={out}"] + [(PACKAGE_PATH / s.name).as_posix() for s in srcs]
        r = subprocess.run(cmd, cwd=include, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"protoc failed:\n{r.stderr}")
        into.mkdir(parents=True, exist_ok=True)
        for stale in into.glob("*_pb2.py"):
            stale.unlink()
        for src in srcs:
            module = f"{src.stem}_pb2.py"
            text = (out / PACKAGE_PATH / module).read_text()
            (into / module).write_text(rewrite_module(text, src.name, tools))
    wkts = well_known_types(srcs)
    init = HEADER.format(source="*.proto", tools=tools) + INIT_TEMPLATE.format(
        wkt_imports="".join(f"from google.protobuf import {m} as _{m}\n"  # in the order ruff sorts them
                            for m in sorted(["descriptor_pool", *(f"{n}_pb2" for n in wkts)])),
        wkt_adds="".join(f"POOL.AddSerializedFile(_{n}_pb2.DESCRIPTOR.serialized_pb)\n" for n in wkts),
    )
    (into / "__init__.py").write_text(init)


def generated_files(folder: Path) -> dict[str, bytes]:
    names = list(folder.glob("*_pb2.py")) + [folder / "__init__.py"]
    return {p.name: p.read_bytes() for p in names if p.exists()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed code, write nothing")
    args = ap.parse_args()
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        print("grpcio-tools is not installed (pip install grpcio-tools)", file=sys.stderr)
        return 2
    if not args.check:
        generate(OUT)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "proto"
        generate(fresh)
        want, have = generated_files(fresh), generated_files(OUT)
        problems = [f"{n}: differs" for n in sorted(want.keys() & have.keys()) if want[n] != have[n]]
        problems += [f"{n}: missing in protocol/proto" for n in sorted(want.keys() - have.keys())]
        problems += [f"{n}: not generated from any proto/*.proto" for n in sorted(have.keys() - want.keys())]
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
