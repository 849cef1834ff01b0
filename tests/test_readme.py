"""Every fenced code block of README.md, checked as written.

The blocks are read from README.md when the tests are collected, never copied here. How each is
checked follows from its language and from an optional marker, an HTML comment on the last
non-blank line before the fence (invisible on GitHub):

    <!-- readme-test: needs-server port=10000 slow -->

- ```python: run as a script of its own (a fresh interpreter, an empty working directory); its
  stdout must match the block's output block (below), which every python block needs.
- ```console: `$ command` lines are run with bash (stdout and stderr together, as a terminal shows
  them); the lines after each, up to the next `$`, are its expected output.
- ```bash / ```sh: run with `bash -e`; with an output block, its stdout must match. With the marker
  `serves`, the block is one command that serves until Ctrl-C: it is started, must print its
  banner and answer a client, and must stop with exit code 0 on SIGINT; with `--data-dir`, a table
  written to it must come back when the same command runs again.
- ```toml: a `--config` file: parsed with tomllib and resolved by tickwire.options for `serve` and
  `demo`; every key must reach the settings with its value (an unknown key fails).
- ```text with the marker `synopsis`: the command-line synopsis; it must name every option of
  `tickwire serve` and `tickwire demo`, and no other.
- ```text with the marker `output`: the expected output of the block before it. A line `...`
  matches any number of lines, and `...` inside a line any text.

Markers: `needs-server` runs the block against a server the test starts (the demo's Python tables,
ticking: static_mixed, ticking_append, ticking_keyed, blink, ticking_ring, ticking_sorted);
`port=N` replaces the number N in the block and its output with that server's port, or, without
`needs-server`, with a free port (the block starts a server of its own); `slow` marks the test
slow. Shell commands run with `tickwire` and `python` meaning this interpreter's, no `TICKWIRE_*`
variables, and `examples/` reachable from the working directory.

A block that cannot run here is listed in NOT_RUN with the reason; any other block that none of
these rules checks fails `test_every_block_is_checked`.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# first line of a block (a prefix of it) -> why it is not run
NOT_RUN = {
    "make test": "`make test` is the whole suite (this file included) and `make demo` serves until Ctrl-C after "
                 "installing everything; the commands they run are covered by tests/test_demo.py",
    "docker build": "no container engine on the CI machine; tests/test_docker_steps.py runs the image's steps",
}

MARKER = re.compile(r"^<!--\s*readme-test:(.*?)-->\s*$")
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")
KNOWN_MARKERS = {"needs-server", "port", "slow", "serves", "synopsis", "output"}
SHELLS = {"bash", "sh", "shell"}


@dataclass
class Block:
    lang: str
    text: str
    line: int  # of the opening fence, 1-based
    markers: dict = field(default_factory=dict)
    output: Optional["Block"] = None

    @property
    def first_line(self) -> str:
        return next((ln.strip() for ln in self.text.splitlines() if ln.strip()), "")

    @property
    def id(self) -> str:
        return f"{self.lang or 'plain'}-line{self.line}"


def parse_markers(text: str) -> dict:
    out = {}
    for word in text.split():
        key, _, value = word.partition("=")
        out[key] = value if value else True
    return out


def read_blocks(markdown: str) -> list[Block]:
    """The fenced blocks in order, each with the marker before it; output blocks are attached to the
    block they follow and not listed themselves."""
    blocks: list[Block] = []
    lines = markdown.splitlines()
    pending: dict = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        m = FENCE.match(line)
        if m is None:
            mm = MARKER.match(line.strip())
            if mm:
                pending = parse_markers(mm.group(1))
            elif line.strip():
                pending = {}
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).lower()
        body = []
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence[0] * len(fence)):
            body.append(lines[j])
            j += 1
        block = Block(lang, "\n".join(body) + "\n", i + 1, pending)
        pending = {}
        if block.markers.get("output") and blocks:
            prev = blocks[-1]
            if prev.output is not None:
                raise AssertionError(f"README.md:{block.line}: a second output block for the block at line {prev.line}")
            prev.output = block
        else:
            blocks.append(block)
        i = j + 1
    return blocks


BLOCKS = read_blocks(README.read_text(encoding="utf-8"))


def not_run_reason(block: Block) -> Optional[str]:
    for prefix, reason in NOT_RUN.items():
        if block.first_line.startswith(prefix):
            return reason
    return None


def how(block: Block) -> str:
    """How the block is checked, or AssertionError saying why it is not."""
    unknown = set(block.markers) - KNOWN_MARKERS
    if unknown:
        raise AssertionError(f"unknown marker(s) {sorted(unknown)}")
    if not_run_reason(block) is not None:
        return "not run"
    if block.markers.get("output"):
        raise AssertionError("an output block that follows no block")
    if block.lang == "python":
        if block.output is None:
            raise AssertionError("a python block needs an output block after it (what it prints)")
        return "python"
    if block.lang == "console":
        return "console"
    if block.lang in SHELLS:
        return "serves" if block.markers.get("serves") else "bash"
    if block.lang == "toml":
        return "toml"
    if block.lang == "text" and block.markers.get("synopsis"):
        return "synopsis"
    raise AssertionError(f"no check for a {block.lang or 'plain'} block: give it a language and a marker, "
                         "or list it in NOT_RUN with the reason")


def test_every_block_is_checked():
    problems = []
    for b in BLOCKS:
        try:
            how(b)
        except AssertionError as exc:
            problems.append(f"README.md:{b.line} ({b.first_line[:60]!r}): {exc}")
        if b.output is not None and how_safe(b) not in ("python", "console", "bash"):
            problems.append(f"README.md:{b.line}: an output block after a block whose output is not compared")
    for prefix in NOT_RUN:
        if not any(b.first_line.startswith(prefix) for b in BLOCKS):
            problems.append(f"NOT_RUN names a block that is gone: {prefix!r}")
    assert not problems, "\n".join(problems)


def how_safe(block: Block) -> Optional[str]:
    try:
        return how(block)
    except AssertionError:
        return None


def test_the_reading_of_blocks():
    text = ("x\n<!-- readme-test: needs-server port=10000 -->\n\n```python\nprint(1)\n```\n"
            "<!-- readme-test: output -->\n```text\n1\n```\n```\nplain\n```\n"
            "<!-- readme-test: slow -->\nsome words\n```bash\nls\n```\n")
    a, b, c = read_blocks(text)
    assert (a.lang, a.text, a.markers, a.output.text) == ("python", "print(1)\n",
                                                          {"needs-server": True, "port": "10000"}, "1\n")
    assert (b.lang, b.first_line, c.markers) == ("", "plain", {})  # words between a marker and a fence end it
    with pytest.raises(AssertionError, match="no check"):
        how(b)


def test_every_example_is_run_by_a_readme_block():
    shown = "".join(b.text for b in BLOCKS if how_safe(b) in ("console", "bash"))
    missing = [p.name for p in sorted((ROOT / "examples").glob("*.py")) if f"examples/{p.name}" not in shown]
    assert not missing, f"examples not run by any README block: {missing}"


# -- output matching ------------------------------------------------------------------------------------------
def _line_matches(pattern: str, line: str) -> bool:
    if "..." not in pattern:
        return pattern == line
    return re.fullmatch(".*".join(re.escape(p) for p in pattern.split("...")), line, re.S) is not None


def matches(expected: str, actual: str) -> bool:
    want = [ln.rstrip() for ln in expected.rstrip("\n").splitlines()]
    got = [ln.rstrip() for ln in actual.rstrip("\n").splitlines()]
    memo: dict = {}

    def go(i: int, j: int) -> bool:
        if (i, j) in memo:
            return memo[i, j]
        if i == len(want):
            ok = j == len(got)
        elif want[i] == "...":
            ok = go(i + 1, j) or (j < len(got) and go(i, j + 1))
        else:
            ok = j < len(got) and _line_matches(want[i], got[j]) and go(i + 1, j + 1)
        memo[i, j] = ok
        return ok

    return go(0, 0)


def assert_output(expected: str, actual: str, what: str) -> None:
    assert matches(expected, actual), f"{what}: the output\n{actual}\ndoes not match\n{expected}"


def test_output_matching():
    assert matches("a\n...\nd\n", "a\nb\nc\nd\n") and matches("a\n...\n", "a\n") and matches("x ... z", "x y z")
    assert not matches("a\nd\n", "a\nb\nd\n") and not matches("x ... z", "x y") and not matches("a", "a\nb")


# -- the environment blocks run in ------------------------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def demo_server():
    """The demo's Python tables (no Spark, no big_static), ticking every 100 ms, with enough rows
    that every key of ticking_keyed exists and ticking_append holds more than 150 rows."""
    from tickwire.server.adapters.demo import DemoTicker
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    engine = Engine(interval_ms=100)
    ticker = DemoTicker(engine, rows_per_tick=5, interval_s=0.1)
    for _ in range(100):
        ticker.tick()
        engine.run_cycle()
    server = TickwireServer(engine, port=0, web=False).start()
    ticker.start()
    yield server
    ticker.stop()
    server.stop()
    engine.stop()


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory):
    """PATH with `tickwire` and `python` of this interpreter first, no TICKWIRE_* variables."""
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "tickwire").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tickwire "$@"\n')
    (bin_dir / "tickwire").chmod(0o755)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKWIRE_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def workdir(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def substituted(block: Block, server) -> tuple[str, str]:
    """(block text, expected output) with the marker's port replaced."""
    text, out = block.text, block.output.text if block.output is not None else ""
    port = block.markers.get("port")
    if port:
        real = str(server.port) if block.markers.get("needs-server") else str(free_port())
        pattern = re.compile(rf"(?<![\d.]){re.escape(port)}(?!\d)")
        text, out = pattern.sub(real, text), pattern.sub(real, out)
    return text, out


# -- the blocks ------------------------------------------------------------------------------------------------
def _params(kinds):
    out = []
    for b in BLOCKS:
        if how_safe(b) in kinds:
            marks = [pytest.mark.slow] if b.markers.get("slow") else []
            out.append(pytest.param(b, id=b.id, marks=marks))
    return out


def _server_for(block: Block, request):
    return request.getfixturevalue("demo_server") if block.markers.get("needs-server") else None


@pytest.mark.parametrize("block", _params({"python"}))
def test_python_block(block, request, workdir, shell_env):
    if "spark" in block.text:
        from tickwire.server.adapters.spark.pipeline_demo import spark_available

        if spark_available():
            pytest.skip(spark_available())
    code, expected = substituted(block, _server_for(block, request))
    script = workdir / "block.py"
    script.write_text(code)
    r = subprocess.run([sys.executable, str(script)], cwd=workdir, env=shell_env, capture_output=True, text=True,
                       timeout=300 if block.markers.get("slow") else 120)
    assert r.returncode == 0, f"README.md:{block.line} failed:\n{r.stderr[-3000:]}"
    assert_output(expected, r.stdout, f"README.md:{block.line}")
    if 'format("tickwire")' in block.text:  # the remote-Spark block: it stops its query, which may be mid-batch
        assert_no_failure_shown(r.stdout + r.stderr, f"README.md:{block.line}")


# what a user reads as a failure in a terminal (Spark's aborts of a stopped query's batch, stacks)
FAILURE_WORDS = ("Exception", "Traceback", "Aborting commit", "leaked", "ERROR")


def assert_no_failure_shown(output: str, what: str) -> None:
    shown = [ln for ln in output.splitlines() if any(word in ln for word in FAILURE_WORDS)]
    assert not shown, f"{what} printed what reads as a failure:\n" + "\n".join(shown[:20]) + \
        f"\n--- its output ends:\n{output[-3000:]}"


def console_commands(text: str) -> list[tuple[str, str]]:
    """[(command, expected output)] of a console block."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"output before the first command: {line!r}")
    return [(cmd, "\n".join(lines)) for cmd, lines in out]


@pytest.mark.parametrize("block", _params({"console", "bash"}))
def test_shell_block(block, request, workdir, shell_env):
    """A ```console block (`$ command` lines, each with its output) or a ```bash / ```sh block (a
    script, run with `bash -e`)."""
    text, expected = substituted(block, _server_for(block, request))
    if how_safe(block) == "console":
        commands = console_commands(text)
        assert commands, f"README.md:{block.line}: no `$ ` command"
        for command, want in commands:
            r = subprocess.run(["bash", "-c", command], cwd=workdir, env=shell_env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=120)
            assert_output(want, r.stdout, f"README.md:{block.line}: $ {command}")
        return
    r = subprocess.run(["bash", "-e", "-c", text], cwd=workdir, env=shell_env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, f"README.md:{block.line} failed:\n{r.stderr[-3000:]}"
    assert block.output is not None or r.stdout.strip(), f"README.md:{block.line}: prints nothing to check"
    if block.output is not None:
        assert_output(expected, r.stdout, f"README.md:{block.line}")


def _serve_once(command: str, workdir: Path, env: dict, before_stop=None) -> str:
    """Starts `command`, waits for its banner, calls before_stop(target, banner text), then stops it
    with SIGINT; returns everything it printed."""
    from tickwire.clients.client import BarrageClient

    p = subprocess.Popen(["bash", "-c", "exec " + command], cwd=workdir, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        m = None
        while time.monotonic() < deadline and m is None:
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"tickwire is serving on ([\d.]+:\d+)", line)
        assert m, f"no banner from `{command}`:\n{''.join(lines)}"
        with BarrageClient(f"grpc://{m.group(1)}") as client:
            client.tables()  # it answers
        if before_stop is not None:
            before_stop(m.group(1), "".join(lines))
        p.send_signal(signal.SIGINT)
        rest, _ = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    out = "".join(lines) + rest
    assert p.returncode == 0, f"`{command}` ended with {p.returncode}:\n{out[-3000:]}"
    assert "tickwire: stopped" in out, out[-3000:]
    return out


@pytest.mark.parametrize("block", _params({"serves"}))
def test_serving_block(block, request, workdir, shell_env):
    import pyarrow as pa
    import pyarrow.flight as flight

    text, _ = substituted(block, _server_for(block, request))
    commands = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(commands) == 1, f"README.md:{block.line}: a serving block is one command"
    command = commands[0]
    data_dir = re.search(r"--data-dir\s+(\S+)", command)
    rows = pa.table({"x": [1, 2, 3]})

    def put(target, banner):
        if data_dir is None:
            return
        assert f"data directory {data_dir.group(1)}: tables recovered: none" in banner, banner
        client = flight.FlightClient(f"grpc://{target}")
        opts = flight.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
        writer, _ = client.do_put(flight.FlightDescriptor.for_path("scope", "readme_t"), rows.schema, opts)
        writer.write_table(rows)
        writer.close()  # answered once the rows are applied (and on disk)
        client.close()

    _serve_once(command, workdir, shell_env, put)
    if data_dir is not None:
        assert (workdir / data_dir.group(1)).is_dir()

        def recovered(target, banner):
            assert f"data directory {data_dir.group(1)}: tables recovered: readme_t" in banner, banner
            from tickwire.clients.client import BarrageClient

            with BarrageClient(target) as client:
                assert client.snapshot("readme_t").column("x").to_pylist() == [1, 2, 3]

        _serve_once(command, workdir, shell_env, recovered)


@pytest.mark.parametrize("block", _params({"toml"}))
def test_toml_block(block, tmp_path):
    from tickwire.cli import build_parser
    from tickwire.options import OPTIONS, resolve

    data = tomllib.loads(block.text)
    path = tmp_path / "tickwire.toml"
    path.write_text(block.text)
    by_name = {o.name: o for o in OPTIONS}
    for command in ("serve", "demo"):
        args = build_parser().parse_args([command, "--config", str(path)])
        settings = resolve(command, args, environ={})
        wanted = {k: v for k, v in data.items() if not isinstance(v, dict)}
        wanted.update(data.get(command, {}))
        for key, value in wanted.items():
            option = by_name[key.replace("_", "-")]
            got = settings.values[option.dest]
            want = value.split() if option.kind == "words" else value
            assert got == want, f"README.md:{block.line}: {key} = {value!r} became {got!r} for {command}"
            assert settings.sources[option.dest] == f"file {path}"


@pytest.mark.parametrize("block", _params({"synopsis"}))
def test_synopsis_block(block, monkeypatch):
    """Names every option of `tickwire serve` and `tickwire demo` and no other; the opposites of
    options (`--no-data-dir`, `--web`: help "leave --X unset" / "the opposite of --X") may be covered
    by the block's sentence on `--no-OPTION` instead. The options are every argument the command
    line's parser gets for each command (recorded as `build_parser` adds them)."""
    import argparse

    from tickwire.cli import build_parser

    added = []  # (the parser's prog, its flags, their help)
    add_argument = argparse.ArgumentParser.add_argument

    def recording(parser, *flags, **options):
        added.append((parser.prog, flags, options.get("help") or ""))
        return add_argument(parser, *flags, **options)

    monkeypatch.setattr(argparse.ArgumentParser, "add_argument", recording)
    progs = {build_parser().prog + " " + command: command for command in ("serve", "demo")}
    monkeypatch.undo()
    assert {prog for prog, _flags, _help in added} >= set(progs), sorted({prog for prog, _f, _h in added})

    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", block.text.replace("--no-OPTION", "")))
    known, opposites = set(), set()
    for prog, flags, helptext in added:
        if prog not in progs:
            continue
        for flag in flags:
            if flag.startswith("--") and flag != "--help":
                known.add(flag)
                if helptext.startswith(("leave --", "the opposite of --")):
                    opposites.add(flag)
    assert named - known == set(), f"README.md:{block.line} names options that do not exist"
    if "--no-OPTION" in block.text:
        named |= opposites
    assert known - named == set(), f"README.md:{block.line} leaves options out"
