#!/usr/bin/env python3
"""Regenerates the Python flatbuffer code committed under protocol/fb/ from the schemas in this folder.

Usage: python flatbuffers/generate.py [--check]

Each `<name>.fbs` here declares `namespace tickwire.protocol.fb.<name>;` (the namespace is not on the
wire, and a Python package named after Deephaven's `io.deephaven` namespace would collide with the
standard library's `io`). flatc writes one module per table into `protocol/fb/<name>/`; every
generated file starts with a header that marks it generated. With --check, nothing is written and the
exit status says whether the committed code matches what flatc produces now.

flatc comes from Debian's `flatbuffers-compiler` package (`apt-get install flatbuffers-compiler`).
"""
from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "protocol" / "fb"
HEADER = "# GENERATED CODE: written by flatbuffers/generate.py from flatbuffers/{schema} with {flatc}. Do not edit.\n"


def flatc_version(flatc: str) -> str:
    return subprocess.run([flatc, "--version"], check=True, capture_output=True, text=True).stdout.strip()


def generate(into: Path, flatc: str) -> None:
    version = flatc_version(flatc)
    into.mkdir(parents=True, exist_ok=True)
    (into / "__init__.py").write_text(
        HEADER.format(schema="*.fbs", flatc=version) + '"""Generated flatbuffer accessors (see flatbuffers/)."""\n'
    )
    for schema in sorted(HERE.glob("*.fbs")):
        text = schema.read_text()
        m = re.search(r"^namespace\s+tickwire\.protocol\.fb\.(\w+)\s*;", text, re.M)
        if not m:
            raise SystemExit(f"{schema.name}: expected 'namespace tickwire.protocol.fb.<name>;'")
        sub = m.group(1)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([flatc, "--python", "-o", tmp, str(schema)], check=True)
            src = Path(tmp) / "tickwire" / "protocol" / "fb" / sub
            dst = into / sub
            if dst.exists():
                shutil.rmtree(dst)
            dst.mkdir(parents=True)
            for f in sorted(src.glob("*.py")):
                body = f.read_text()
                if f.name == "__init__.py":
                    body = ""
                (dst / f.name).write_text(HEADER.format(schema=schema.name, flatc=version) + body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed code, write nothing")
    ap.add_argument("--flatc", default=shutil.which("flatc") or "flatc")
    args = ap.parse_args()
    if not shutil.which(args.flatc):
        print("flatc not found: apt-get install flatbuffers-compiler", file=sys.stderr)
        return 2
    if not args.check:
        generate(OUT, args.flatc)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "fb"
        generate(fresh, args.flatc)
        cmp = filecmp.dircmp(fresh, OUT)
        problems: list[str] = []

        def walk(c: filecmp.dircmp, rel: str) -> None:
            problems.extend(f"{rel}{n}: differs" for n in c.diff_files)
            problems.extend(f"{rel}{n}: missing in protocol/fb" for n in c.left_only if n != "__pycache__")
            problems.extend(f"{rel}{n}: not generated" for n in c.right_only if n != "__pycache__")
            for name, subcmp in c.subdirs.items():
                if name != "__pycache__":
                    walk(subcmp, f"{rel}{name}/")

        walk(cmp, "")
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
