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
