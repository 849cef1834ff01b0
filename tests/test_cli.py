"""The command line as an operator meets it: configuration (flags > TICKWIRE_* environment > TOML
file > defaults), --print-config, one-line startup errors, the connect banner, and the logs."""
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from tests import waiting
from tests.certs import self_signed
from tickwire.cli import build_parser
from tickwire.demo import connect_help
from tickwire.options import ConfigError, render, resolve


def run(*args, env=None, timeout=60):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TICKWIRE_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "tickwire", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def settings(*argv, environ=None):
    args = build_parser().parse_args(list(argv))
    return resolve(args.command, args, environ or {})


@pytest.fixture(scope="module")
def tls_pair(tmp_path_factory):
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    return str(cert), str(key)


# -- configuration -----------------------------------------------------------------------------------------
def test_precedence_is_flag_over_environment_over_file_over_default(tmp_path):
    cfg = tmp_path / "tickwire.toml"
    cfg.write_text('port = 1111\nhost = "0.0.0.0"\ninterval_ms = 50\nno-web = true\nfsync = "interval 20"\n'
                   '[serve]\npsk = "from-file"\n[demo]\nport = 2222\n')
    s = settings("serve", "--config", str(cfg))
    assert (s.port, s.host, s.interval_ms, s.no_web, s.fsync, s.psk) == (1111, "0.0.0.0", 50.0, True,
                                                                         ["interval", "20"], "from-file")
    assert s.sources["port"] == f"file {cfg}" and s.sources["duration"] == "default"
    assert settings("demo", "--config", str(cfg)).port == 2222  # the [demo] table over the top-level key
    env = {"TICKWIRE_PORT": "3333", "TICKWIRE_NO_WEB": "false", "TICKWIRE_FSYNC": "off"}
    s = settings("serve", "--config", str(cfg), environ=env)
    assert (s.port, s.no_web, s.fsync, s.host) == (3333, False, ["off"], "0.0.0.0")
    assert s.sources["port"] == "env TICKWIRE_PORT"
    s = settings("serve", "--config", str(cfg), "--port", "4444", "--fsync", "cycle", environ=env)
    assert (s.port, s.fsync, s.sources["port"]) == (4444, ["cycle"], "flag")
    # the file may come from the environment too
    assert settings("serve", environ={"TICKWIRE_CONFIG": str(cfg)}).port == 1111
    d = settings("serve")
    assert (d.port, d.host, d.interval_ms, d.psk, d.no_web, d.fsync, d.log_level) == (
        10000, "127.0.0.1", 100.0, None, False, ["cycle"], "info")


def test_flags_turn_off_what_the_environment_or_the_file_turned_on(tmp_path, tls_pair):
    cert, key = tls_pair
    cfg = tmp_path / "on.toml"
    cfg.write_text(f'no-web = true\ndata-dir = "{tmp_path}"\nlog-format = "json"\n'
                   f'metrics-port = 9100\ntls-cert = "{cert}"\ntls-key = "{key}"\n'
                   '[serve]\nupstream-tls = true\nreplicate = "h:1/t"\n'
                   '[demo]\nno-spark = true\nno-server = true\nstatus-interval = 5\n')
    env = {"TICKWIRE_CONFIG": str(cfg), "TICKWIRE_PSK": "from-env"}
    on = settings("serve", environ=env)
    assert (on.no_web, on.upstream_tls, on.data_dir, on.log_format, on.metrics_port, on.tls_cert, on.psk) == (
        True, True, str(tmp_path), "json", 9100, cert, "from-env")
    off = settings("serve", "--web", "--no-upstream-tls", "--no-data-dir", "--log-format", "text",
                   "--no-metrics-port", "--no-tls", "--no-psk", "--no-replicate", environ=env)
    assert (off.no_web, off.upstream_tls, off.data_dir, off.log_format, off.metrics_port, off.tls_cert,
            off.tls_key, off.psk, off.replicate) == (False, False, None, "text", None, None, None, None, None)
    assert all(off.sources[d] == "flag" for d in ("no_web", "upstream_tls", "data_dir", "tls_cert", "tls_key", "psk"))
    assert "# data-dir = (unset)  # flag" in render(off) and "no-web = false  # flag" in render(off)
    demo = settings("demo", environ=env)
    assert (demo.no_spark, demo.no_server, demo.status_interval) == (True, True, 5.0)
    demo = settings("demo", "--spark", "--server", "--no-status-interval", environ=env)
    assert (demo.no_spark, demo.no_server, demo.status_interval) == (False, False, None)
    # the last of a switch and its opposite wins, as flags do
    assert settings("serve", "--web", "--no-web").no_web is True
    assert settings("serve", "--no-web", "--web").no_web is False


def test_replicate_under_local_names_and_its_refusal():
    from tickwire.options import server_config

    cfg = server_config(settings("serve", "--replicate", "a:1/trades=trades_a, b:2/trades=trades_b"))
    assert cfg.replicate == ("a:1/trades=trades_a", "b:2/trades=trades_b")
    with pytest.raises(ConfigError, match="would both be served as 'trades'"):
        server_config(settings("serve", "--replicate", "a:1/trades,b:2/trades"))


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_every_switch_and_every_unset_by_default_option_has_a_flag_that_turns_it_off(command):
    from tickwire.options import opposite, options_for

    parser = build_parser()
    for o in options_for(command):
        if o.kind == "bool":
            argv, env = [opposite(o)], {o.env: "true"}
            expected = False
        elif o.default is None:
            argv, env = ["--no-" + o.name], {o.env: "1"}  # any value: it is unset before it is read
            expected = None
        else:
            continue  # an option with a default takes another value by its own flag
        args = parser.parse_args([command, *argv])
        assert resolve(command, args, env).values[o.dest] is expected, o.name


def test_print_config_shows_effective_values_with_the_key_masked(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("interval-ms = 25\n")
    r = run("serve", "--print-config", "--config", str(cfg), "--psk", "sup3rsecret", env={"TICKWIRE_PORT": "12345"})
    assert r.returncode == 0, r.stderr
    assert "port = 12345  # env TICKWIRE_PORT" in r.stdout
    assert f"interval-ms = 25.0  # file {cfg}" in r.stdout
    assert 'psk = "su***"  # flag' in r.stdout and "sup3rsecret" not in r.stdout + r.stderr
    assert "serving" not in r.stdout  # printed and exited
    # what it prints is a usable config file
    import tomllib
    values = tomllib.loads(r.stdout)
    assert values["port"] == 12345 and values["fsync"] == "cycle"


def test_render_round_trips_through_resolve(tmp_path):
    s = settings("demo", "--port", "0", "--no-spark", "--status-interval", "2", "--fsync", "interval", "5")
    cfg = tmp_path / "again.toml"
    cfg.write_text(render(s))
    again = settings("demo", "--config", str(cfg))
    assert again.values == s.values


def test_help_shows_defaults_and_environment_variables():
    r = run("serve", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "default: 10000" in text and "TICKWIRE_PORT" in text and "default: 100.0" in text
    assert "TICKWIRE_LOG_LEVEL" in text and "--print-config" in text
    r = run("demo", "--help")
    assert "--status-interval" in r.stdout and "TICKWIRE_NO_SPARK" in " ".join(r.stdout.split())


@pytest.mark.parametrize("argv, environ, message", [
    (["--port", "99999"], {}, "--port 99999: a port is 1-65535"),
    (["--port", "-5"], {}, "--port -5"),
    (["--web-port", "70000"], {}, "--web-port 70000"),
    (["--interval-ms", "0"], {}, "--interval-ms 0: want a number above 0"),
    (["--interval-ms", "-1"], {}, "--interval-ms -1"),
    ([], {"TICKWIRE_PORT": "abc"}, "port = 'abc' (env TICKWIRE_PORT): want a whole number"),
    ([], {"TICKWIRE_NO_WEB": "maybe"}, "TICKWIRE_NO_WEB"),
    (["--max-inbound-message-size", "0"], {}, "want a positive number"),
])
def test_bad_values_are_refused(argv, environ, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        settings("serve", *argv, environ=environ)


# -- startup errors: one line on stderr, a non-zero exit -----------------------------------------------------
def _one_line_error(r, *fragments):
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and lines[0].startswith("tickwire")
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def busy_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "not-a-cert.pem").write_text("hello\n")
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "bad.toml").write_text("port = \n")
    (tmp_path / "unknown.toml").write_text("prot = 1\n")
    return tmp_path


CASES = {
    "port out of range": (["--port", "99999"], ["--port 99999"]),
    "negative port": (["--port", "-5"], ["--port -5"]),
    "zero interval": (["--interval-ms", "0"], ["--interval-ms 0"]),
    "certificate without key": (["--tls-cert", "{tmp}/not-a-cert.pem"], ["--tls-key is missing"]),
    "missing certificate": (["--tls-cert", "{tmp}/nope.pem", "--tls-key", "{tmp}/nope.key"],
                            ["--tls-cert", "nope.pem", "cannot read it"]),
    "not a certificate": (["--tls-cert", "{tmp}/not-a-cert.pem", "--tls-key", "{tmp}/not-a-cert.pem"],
                          ["not a PEM certificate"]),
    "bad data dir": (["--data-dir", "{tmp}/a-file"], ["data directory", "a-file"]),
    "bad web assets": (["--web-assets", "{tmp}/nowhere"], ["--web-assets", "nowhere"]),
    "bad fsync": (["--fsync", "sometimes"], ["--fsync sometimes"]),
    "bad config file": (["--config", "{tmp}/bad.toml"], ["bad.toml", "not valid TOML"]),
    "unknown config key": (["--config", "{tmp}/unknown.toml"], ["unknown option 'prot'"]),
    "missing config file": (["--config", "{tmp}/missing.toml"], ["missing.toml", "cannot read"]),
    "unknown flag": (["--prot", "1"], ["unrecognized arguments: --prot"]),
    "bad log level": (["--log-level", "loud"], ["--log-level", "loud"]),
    "zero staging limit": (["--staging-limit-mb", "0"], ["--staging-limit-mb 0", "positive"]),
    "zero staging ttl": (["--staging-ttl", "0"], ["--staging-ttl 0", "above 0"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_serve_startup_mistakes_are_one_line_and_a_non_zero_exit(case, bad_files):
    argv, fragments = CASES[case]
    argv = [a.replace("{tmp}", str(bad_files)) for a in argv]
    r = run("serve", "--port", "0", *argv, "--duration", "1") if "--port" not in argv else \
        run("serve", *argv, "--duration", "1")
    _one_line_error(r, *fragments)


def test_port_in_use_is_one_line(busy_port):
    r = run("serve", "--port", str(busy_port), "--duration", "1")
    _one_line_error(r, f"127.0.0.1:{busy_port}", "in use")
    r = run("serve", "--port", "0", "--web-port", str(busy_port), "--duration", "1")
    _one_line_error(r, "--web-port", "in use")


def test_demo_finds_its_port_taken_before_starting_spark(busy_port, tmp_path):
    """pyspark launches Spark's JVM with $SPARK_HOME/bin/spark-submit: a stand-in there notes each
    launch (and fails it), so whether Spark was started is seen, not guessed from how long it took."""
    from tickwire.server.adapters.spark.pipeline_demo import spark_available

    home = tmp_path / "spark-home"
    (home / "bin").mkdir(parents=True)
    submit = home / "bin" / "spark-submit"
    submit.write_text('#!/bin/sh\necho "$*" >> "$(dirname "$0")/../launched"\nexit 1\n')
    submit.chmod(0o755)
    launched = home / "launched"
    env = {"SPARK_HOME": str(home)}
    r = run("demo", "--port", str(busy_port), "--duration", "1", env=env)  # Spark included, when it can run here
    _one_line_error(r, f"127.0.0.1:{busy_port}", "in use")
    assert not launched.exists(), launched.read_text()  # Spark was never started
    if spark_available() is None:  # the stand-in is what a demo that can use Spark launches
        r = run("demo", "--port", "0", "--duration", "1", env=env)
        assert r.returncode != 0 and launched.exists(), (r.returncode, r.stderr[-2000:])


def test_debug_log_level_adds_the_traceback(bad_files):
    r = run("serve", "--port", "0", "--data-dir", str(bad_files / "a-file"), "--duration", "1", "--log-level", "debug")
    assert r.returncode == 1
    assert "Traceback" in r.stderr and r.stderr.strip().splitlines()[-1].startswith("tickwire: data directory")


# -- the banner ----------------------------------------------------------------------------------------------
def test_banner_of_serve_under_tls_and_psk(tls_pair):
    cert, key = tls_pair
    r = run("serve", "--port", "0", "--host", "localhost", "--psk", "hunter22", "--tls-cert", cert, "--tls-key", key,
            "--web-port", "0", "--duration", "1")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "hunter22" not in out + r.stderr and "hu***" in out
    assert re.search(r"FlightClient\('grpc\+tls://localhost:\d+', tls_root_certs=", out), out
    assert "grpc://" not in out
    assert "use_tls=True" in out and re.search(r"BarrageClient\('localhost:\d+', psk='hu\*\*\*', tls=True", out)
    assert "https://localhost:" in out  # the web side, with TLS
    for demo_table in ("static_mixed", "ticking_keyed", "ticking_append"):
        assert demo_table not in out  # serve has no demo tables
    assert "no tables yet" in out and "do_put" in out


def test_banner_names_only_existing_tables_and_plain_urls_without_tls():
    text = connect_help("0.0.0.0", 10000, None, "http://127.0.0.1:10000", tables=["trades", "quotes"])
    assert "serving on 0.0.0.0:10000" in text
    assert "grpc://127.0.0.1:10000" in text and "use_tls" not in text and "tls=True" not in text
    assert "b's/quotes'" in text and "static_mixed" not in text and "ticking_" not in text
    assert "http://127.0.0.1:10000/iframe/widget/?name=quotes" in text
    text = connect_help("127.0.0.1", 10000, "abcdef", None, tls=True, tables=["static_mixed", "ticking_keyed"])
    assert "abcdef" not in text and "ab***" in text and "grpc+tls://127.0.0.1:10000" in text
    assert "iframe" not in text  # no web side
    assert "b's/static_mixed'" in text and "open_table('ticking_keyed')" in text


def test_demo_banner_comes_once_the_tables_exist_and_status_lines_are_off_by_default():
    r = run("demo", "--no-spark", "--port", "0", "--duration", "1.5", "--interval-ms", "50", "--no-web")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("tickwire is serving on") == 1
    assert "tables: big_static, blink, static_mixed" in r.stdout
    assert not re.search(r"^step \d+:", r.stdout, re.M)
    r = run("demo", "--no-spark", "--no-server", "--duration", "1.5", "--interval-ms", "50",
            "--status-interval", "0.5")
    assert r.returncode == 0, r.stderr
    assert len(re.findall(r"^step \d+:", r.stdout, re.M)) >= 2


# -- logs ------------------------------------------------------------------------------------------------------
def _client_ports(server_port: int) -> set[int]:
    """Local ports of this machine's TCP connections to `server_port` (the clients' side; grpcio's
    sockets are IPv6 ones holding IPv4-mapped addresses)."""
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, remote = line.split()[1:3]
                if int(remote.rpartition(":")[2], 16) == server_port:
                    ports.add(int(local.rpartition(":")[2], 16))
    return ports


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the connections in /proc/net/tcp")
def test_grpc_calls_through_the_shared_port_are_logged_with_the_clients_own_address(caplog):
    import pyarrow as pa

    from tickwire.clients.client import BarrageClient
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec

    caplog.set_level(logging.INFO, logger="tickwire")
    engine = Engine(interval_ms=20)
    engine.create(TableSpec("t", "static", data=pa.table({"a": [1, 2, 3]})))
    srv = TickwireServer(engine, port=0).start()  # the web side on: gRPC goes through the splitter
    try:
        assert srv.splitter is not None
        with BarrageClient(srv.target) as client:
            sub = client.subscribe("t")
            assert sub.wait_for(lambda s: s.size == 3, 20)
            ports = _client_ports(srv.port)
            assert ports
            opened = [r for r in caplog.records if getattr(r, "event", None) == "session_open"]
            assert opened and all(parse_port(r.peer) in ports for r in opened), ([r.peer for r in opened], ports)
            assert all(r.peer.startswith("ipv4:127.0.0.1:") for r in opened)
            started = [r for r in caplog.records if getattr(r, "event", None) == "subscription_start"]
            assert started and parse_port(started[0].peer) in ports
            assert f"peer {opened[0].peer}" in opened[0].getMessage()
            # grpcio itself still sees the loopback hop (the splitter's connection to grpcio's
            # private port), whose port is not the client's
            hops = _client_ports(srv.splitter.upstream[1])
            assert hops and not hops & ports
            assert srv.splitter.real_peer(f"ipv4:127.0.0.1:{next(iter(hops))}") in {r.peer for r in opened}
            assert srv.splitter.real_peer("ipv4:10.9.8.7:1") == "ipv4:10.9.8.7:1"  # not one of its hops
    finally:
        srv.stop()
        engine.stop()


def parse_port(peer: str) -> int:
    return int(peer.rpartition(":")[2])


def test_session_life_is_logged(caplog):
    from tickwire.server.services.sessions import PSK_SCHEME, AuthError, SessionManager

    caplog.set_level(logging.INFO, logger="tickwire")
    m = SessionManager(psk="k3y")
    s = m.authenticate([("authorization", f"{PSK_SCHEME} k3y")], peer="ipv4:10.0.0.7:5000")
    with pytest.raises(AuthError):
        m.authenticate([("authorization", f"{PSK_SCHEME} wrong")], peer="ipv4:10.0.0.8:5001")
    with pytest.raises(AuthError):
        m.authenticate([("authorization", "Anonymous")])
    m.close(s)
    m.close(s)  # a second close logs nothing
    t = m.authenticate([("authorization", f"{PSK_SCHEME} k3y")], peer="ipv4:10.0.0.9:5002")
    m.reap(now=time.monotonic() + 3600)
    m.stop()
    records = [r for r in caplog.records if r.name == "tickwire.server.services.sessions"]
    opened = [r for r in records if getattr(r, "event", None) == "session_open"]
    assert [(r.session, r.auth, r.peer, r.levelno) for r in opened] == [
        (s.id, "psk", "ipv4:10.0.0.7:5000", logging.INFO), (t.id, "psk", "ipv4:10.0.0.9:5002", logging.INFO)]
    ended = [(r.session, r.reason, r.peer) for r in records if getattr(r, "event", None) == "session_end"]
    assert ended == [(s.id, "closed", "ipv4:10.0.0.7:5000"), (t.id, "expired", "ipv4:10.0.0.9:5002")]
    refused = [r for r in records if getattr(r, "event", None) == "auth_refused"]
    assert [r.levelno for r in refused] == [logging.WARNING, logging.WARNING]
    assert "wrong pre-shared key" in refused[0].getMessage() and "10.0.0.8" in refused[0].getMessage()
    assert "k3y" not in caplog.text and "wrong" not in "".join(str(getattr(r, "reason", "")) for r in opened)
    assert s.token not in caplog.text  # the bearer token is a secret: sessions are logged by id


def test_subscription_and_refused_put_are_logged_with_ids(caplog):
    import pyarrow as pa
    import pyarrow.flight as fl

    from tickwire.clients.client import BarrageClient
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec

    caplog.set_level(logging.DEBUG, logger="tickwire")
    engine = Engine(interval_ms=20)
    table, _ = engine.get_or_create(TableSpec("t", "append", pa.schema([("x", pa.int64())])))
    server = TickwireServer(engine, port=0, web=False).start()
    try:
        engine.write(table, pa.table({"x": [1, 2, 3]}))
        with BarrageClient(f"127.0.0.1:{server.port}") as client:
            sub = client.subscribe("t", viewport=[(0, 1)])
            assert sub.wait_for(lambda s: s.size == 3, timeout=10)  # a viewport: the table's size
            sub.close()
        flight = fl.FlightClient(f"grpc://127.0.0.1:{server.port}")
        opts = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
        data = pa.table({"x": [4]})
        w, _ = flight.do_put(fl.FlightDescriptor.for_path("scope", "t"), data.schema, opts)
        w.write_table(data)
        w.close()
        with pytest.raises((fl.FlightError, pa.ArrowInvalid)):
            w, _ = flight.do_put(fl.FlightDescriptor.for_path("scope", "__x"), data.schema, opts)
            w.write_table(data)
            w.close()
        flight.close()
        # the server logs the end once its side of the closed stream is over; the asserts below say if never
        waiting.wait_until(lambda: any(getattr(r, "event", None) == "subscription_end" for r in caplog.records),
                           30, interval=0.05)
    finally:
        server.stop()
        engine.stop()
    events = {}
    for r in caplog.records:
        events.setdefault(getattr(r, "event", None), []).append(r)
    start, = events["subscription_start"]
    assert start.levelno == logging.INFO and start.table == "t" and "viewport 0-1" in start.view
    assert start.peer.startswith("ipv4:127.0.0.1:") and isinstance(start.session, int)
    end, = events["subscription_end"]
    assert end.subscription == start.subscription and end.outcome and end.levelno == logging.INFO
    put, = events["doput"]
    assert put.levelno == logging.DEBUG and put.rows == 1  # per-write logs are DEBUG
    refused, = events["doput_refused"]
    assert refused.levelno == logging.WARNING and "reserved" in refused.outcome and refused.path == ["scope", "__x"]


def test_json_log_format():
    r = run("serve", "--port", "0", "--no-web", "--duration", "0.5", "--log-format", "json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stderr.strip().splitlines()]
    assert lines, r.stderr
    for obj in lines:
        assert {"time", "level", "logger", "message"} <= set(obj)
    assert any(o["logger"] == "tickwire.server.app" and "serving on" in o["message"] and o["level"] == "INFO"
               for o in lines)


def test_json_formatter_carries_the_extra_ids():
    from tickwire.logs import JsonFormatter

    rec = logging.LogRecord("tickwire.server.services.sessions", logging.INFO, __file__, 1, "session %d opened", (3,),
                            None)
    rec.session, rec.peer, rec.auth = 3, "ipv4:1.2.3.4:5", "psk"
    obj = json.loads(JsonFormatter().format(rec))
    assert obj["message"] == "session 3 opened" and obj["level"] == "INFO"
    assert (obj["session"], obj["peer"], obj["auth"]) == (3, "ipv4:1.2.3.4:5", "psk")
    assert obj["time"].endswith("+00:00")


def test_log_level_warning_hides_info():
    r = run("serve", "--port", "0", "--no-web", "--duration", "0.5", "--log-level", "warning")
    assert r.returncode == 0 and r.stderr.strip() == "", r.stderr


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    import subprocess
    import sys

    for argv in (["serve", "--print-config"], ["serve", "--port", "0", "--no-web", "--duration", "5"]):
        proc = subprocess.Popen([sys.executable, "-m", "tickwire", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        proc.stdout.readline()
        proc.stdout.close()  # the reader leaves, as `| head -1` does
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert b"Traceback" not in err and b"Broken pipe" not in err, err
