"""The Docker image's steps, run on this host (no container engine here): the same base packages,
the same pip command into a fresh venv, the same entrypoint and environment, and its HEALTHCHECK.

The Dockerfile is read first, so that the test runs what the image runs: its RUN lines must be the
two install scripts, its environment and entrypoint are the ones used below."""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "docker" / "Dockerfile"

pytestmark = pytest.mark.slow


def dockerfile() -> dict:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    out: dict = {"RUN": [], "COPY": [], "ENV": {}}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word in ("RUN", "COPY"):
            out[word].append(rest.strip())
        elif word == "ENV":
            for k, v in re.findall(r"(\w+)=(\S+)", rest):
                out["ENV"][k] = v
        else:
            out[word] = rest.strip()
    return out


def test_the_dockerfile_is_what_the_host_steps_run():
    d = dockerfile()
    assert d["FROM"] == "python:3.11-slim-bookworm"  # Debian 12: it has openjdk-17
    assert d["RUN"][0] == "sh /tmp/install-system.sh && rm /tmp/install-system.sh"
    assert d["RUN"][1] == "PIP_NO_CACHE_DIR=1 sh docker/install-python.sh /opt/venv"
    assert d["RUN"][2].startswith("useradd") and d["USER"] == "tickwire"  # not root
    assert d["ENV"]["TICKWIRE_HOST"] == "0.0.0.0" and d["ENV"]["TICKWIRE_DATA_DIR"] == "/data"
    assert d["ENTRYPOINT"] == '["tickwire"]' and d["CMD"] == '["serve"]'
    assert "docker/healthcheck.py" in d["HEALTHCHECK"] and d["EXPOSE"] == d["ENV"]["TICKWIRE_PORT"]
    copied = {c.split()[0] for c in d["COPY"]}
    for path in ("pyproject.toml", "tickwire", "protocol", "server", "clients", "docker"):
        assert path in copied
    assert "tickwire-data:/data" in (ROOT / "docker" / "compose.yaml").read_text()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory):
    """The image's /opt/venv, made by its own script from the files a build would copy. The build
    runs it with PIP_NO_CACHE_DIR=1 (no pip cache in the image); here pip may use this host's
    cache, which saves downloading pyspark and building its wheel again, not installing it."""
    check = subprocess.run(["sh", str(ROOT / "docker" / "install-system.sh"), "--check"], capture_output=True,
                           text=True)
    if check.returncode != 0:
        pytest.skip(f"the image's system packages are not on this host: {check.stdout.strip()}")
    base = tmp_path_factory.mktemp("image")
    src = base / "opt-tickwire"
    tracked = subprocess.run(["git", "ls-files", "pyproject.toml", "setup.py", "README.md", "tickwire", "protocol",
                              "server", "clients", "docker"], cwd=ROOT, capture_output=True, text=True, check=True)
    for rel in tracked.stdout.split():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    venv = base / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PIP_NO_CACHE_DIR"}
    r = subprocess.run(["sh", "docker/install-python.sh", str(venv)], cwd=src, capture_output=True, text=True,
                       timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    return src, venv


def test_the_entrypoint_serves_on_every_interface_keeps_data_and_passes_its_healthcheck(image_venv, tmp_path):
    src, venv = image_venv
    port = _free_port()
    d = dockerfile()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKWIRE_")}
    env.update(d["ENV"])
    env.update(PATH=f"{venv}/bin:{env.get('PATH', '')}", TICKWIRE_PORT=str(port),
               TICKWIRE_DATA_DIR=str(tmp_path / "data"))
    env.pop("PYTHONPATH", None)
    entry = [str(venv / "bin" / "tickwire"), "serve"]  # ENTRYPOINT + CMD
    health = [str(venv / "bin" / "python"), str(src / "docker" / "healthcheck.py")]

    def start():
        return subprocess.Popen(entry, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def healthy(proc, timeout=60) -> str:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            r = subprocess.run(health, env=env, capture_output=True, text=True)
            last = r.stdout + r.stderr
            if r.returncode == 0:
                return last
            time.sleep(0.5)
        raise AssertionError(f"never healthy: {last}")

    opts = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
    proc = start()
    try:
        assert "SERVING" in healthy(proc)
        # 0.0.0.0: reachable on a non-loopback address of this host too, when it has one
        addrs = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
        for host in ["127.0.0.1", *sorted(addrs)[:1]]:
            with socket.create_connection((host, port), timeout=5):
                pass
        client = fl.FlightClient(f"grpc://127.0.0.1:{port}")
        data = pa.table({"x": list(range(100))})
        writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", "kept"), data.schema, opts)
        writer.write_table(data)
        writer.close()
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    proc = start()  # the volume's data comes back
    try:
        healthy(proc)
        got = fl.FlightClient(f"grpc://127.0.0.1:{port}").do_get(fl.Ticket(b"s/kept"), opts).read_all()
        assert got.column("x").to_pylist() == list(range(100))
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out[-2000:]
    assert "Traceback" not in out, out[-2000:]
