"""The package layout the project promises: one `tickwire` package mapped onto the top-level folders."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_subpackages_live_in_top_level_folders():
    import tickwire.clients
    import tickwire.protocol
    import tickwire.server

    assert Path(tickwire.protocol.__file__).parent == ROOT / "protocol"
    assert Path(tickwire.server.__file__).parent == ROOT / "server"
    assert Path(tickwire.clients.__file__).parent == ROOT / "clients"


def test_flatbuffers_runtime_is_not_shadowed():
    import flatbuffers

    assert "site-packages" in flatbuffers.__file__
    assert not (ROOT / "flatbuffers" / "__init__.py").exists()


def test_protocol_layer_is_sans_io():
    banned = ("import grpc", "import socket", "import threading", "from grpc", "import asyncio")
    for path in (ROOT / "protocol").rglob("*.py"):
        text = path.read_text()
        for b in banned:
            assert b not in text, f"{path.relative_to(ROOT)} contains {b!r}"


@pytest.mark.skipif(shutil.which("flatc") is None, reason="flatc not installed (apt-get install flatbuffers-compiler)")
def test_generated_flatbuffer_code_is_reproducible():
    r = subprocess.run([sys.executable, str(ROOT / "flatbuffers" / "generate.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_generated_files_are_marked():
    files = list((ROOT / "protocol" / "fb").rglob("*.py"))
    assert files
    for f in files:
        assert f.read_text().startswith("# GENERATED CODE"), f


def test_code_cites_the_docs_pages():
    """Comments cite the wire as `docs/<page>.md#<anchor>`, never the out-of-tree BARRAGE-WIRE.md or
    a bare `§` section, and every cited anchor is a heading of that page (GitHub's anchor rules:
    lower case, punctuation other than `-` and `_` dropped, spaces to `-`, repeats numbered `-1`...)."""
    import re

    def anchors(markdown: str) -> set[str]:
        out, seen, fence = set(), {}, False
        for line in markdown.splitlines():
            if line.lstrip().startswith(("```", "~~~")):
                fence = not fence
                continue
            m = re.match(r" {0,3}#{1,6}\s+(.+?)(?:\s+#+)?\s*$", line)
            if fence or not m:
                continue
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
        return out

    assert anchors("# A `b_c` d\n```\n# not a heading\n```\n## A b_c d\n## Sessions, and PSK's headers\n") == {
        "a-b_c-d", "a-b_c-d-1", "sessions-and-psks-headers"}

    cite = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+))?")
    pages: dict[str, set[str] | None] = {}
    stale, broken, cited = [], [], 0
    for top in ("protocol", "server", "clients", "tickwire"):
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo", ".so"):
                continue
            rel = path.relative_to(ROOT)
            for lineno, line in enumerate(path.read_bytes().decode("utf-8", "replace").splitlines(), 1):
                if "BARRAGE-WIRE.md" in line or "§" in line:
                    stale.append(f"{rel}:{lineno}: {line.strip()}")
                for page, anchor in cite.findall(line):
                    cited += 1
                    if page not in pages:
                        doc = ROOT / "docs" / page
                        pages[page] = anchors(doc.read_text(encoding="utf-8")) if doc.is_file() else None
                    if pages[page] is None:
                        broken.append(f"{rel}:{lineno}: docs/{page} does not exist")
                    elif anchor and anchor not in pages[page]:
                        broken.append(f"{rel}:{lineno}: docs/{page} has no heading with anchor #{anchor}")
    assert not stale, "cite docs/<page>.md#<anchor> instead:\n" + "\n".join(stale)
    assert not broken, "\n".join(broken)
    assert cited, "no docs/<page>.md#<anchor> citations found"
