"""A self-signed certificate for localhost, made with openssl, for the tests that serve TLS."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(cert, key) PEM files in `folder`, valid for localhost; skips the test without openssl."""
    cert, key = Path(folder) / "cert.pem", Path(folder) / "key.pem"
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"openssl cannot make a test certificate: {r.stderr[-200:]!r}")
    return cert, key
