"""The command line's options, from flags, `TICKWIRE_*` environment variables and a TOML file.

Every option of `tickwire serve` and `tickwire demo` can be given three ways; the first found wins:

1. a flag: `--port 10001`;
2. an environment variable: `TICKWIRE_PORT=10001` (the flag's name in capitals, `-` as `_`; a
   switch such as `--no-web` takes 1/true/yes/on or 0/false/no/off; `--fsync` takes
   `"interval 50"`);
3. the TOML file of `--config PATH` (or `TICKWIRE_CONFIG`): top-level keys apply to every command,
   a `[serve]` or `[demo]` table to that command only (`port = 10001`, `no-web = true`,
   `fsync = "interval 50"`; `interval_ms` and `interval-ms` are the same key);

else the option's default. Values are checked once, before anything starts; a mistake is one
`ConfigError` line naming where the value came from. `server_config(settings)` turns them into
the one `ServerConfig` a server is built from (the engine's options in its `engine` field).

Whatever the environment or the file turned on, a flag turns off: each switch has its opposite
(`--web` for `--no-web`, `--no-upstream-tls` for `--upstream-tls`), each option that is unset by
default has `--no-<option>` (`--no-data-dir`: in memory only; `--no-status-interval`: no status
lines; `--no-metrics-port`, `--no-psk`, ...), `--no-tls` unsets both `--tls-cert` and `--tls-key`,
and the choices and `--fsync` take their other values (`--log-format text`, `--fsync off`).
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

__all__ = ["Option", "OPTIONS", "ConfigError", "Settings", "add_options", "resolve", "render", "mask", "server_config",
           "durability"]

ENV_PREFIX = "TICKWIRE_"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


class ConfigError(ValueError):
    """A value that cannot be used; the message is one line naming the option and its source."""


@dataclass(frozen=True)
class Option:
    name: str  # the flag without its dashes: "interval-ms"
    kind: str  # "str", "int", "float", "port", "bool", "words", "choice"
    default: Any
    help: str
    commands: tuple[str, ...] = ("serve", "demo")
    metavar: Optional[str] = None
    choices: tuple[str, ...] = ()
    secret: bool = False

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name


BOTH = ("serve", "demo")
OPTIONS: tuple[Option, ...] = (
    Option("host", "str", "127.0.0.1", "address to listen on (0.0.0.0 for every interface)"),
    Option("port", "port", 10000, "port (0 picks a free one)"),
    Option("interval-ms", "float", 100.0, "update graph cycle interval, milliseconds"),
    Option("psk", "str", None, "require this pre-shared key (Deephaven PSK authentication)", secret=True,
           metavar="KEY"),
    Option("tls-cert", "file", None, "PEM certificate: serve TLS (needs --tls-key)", metavar="PATH"),
    Option("tls-key", "file", None, "PEM private key for --tls-cert", metavar="PATH"),
    Option("max-inbound-message-size", "int", 100 * 1024 * 1024,
           "largest gRPC message a client may send (a DoPut batch, a request); 100 MiB, as Deephaven's",
           metavar="BYTES"),
    Option("web-port", "port", None, "serve browsers (Deephaven's JS API and grid page) on this port instead of the "
                                     "main one (needed with TLS; 0 picks a free one)"),
    Option("web-assets", "str", None, "a deephaven-web jar or directory to serve the browser pages from (default: "
                                      "the installed deephaven-server package, `pip install 'tickwire[web]'`)",
           metavar="PATH"),
    Option("no-web", "bool", False, "no browser side: the port serves gRPC only"),
    Option("metrics-port", "port", None, "serve /metrics and /healthz on this port of their own (0 picks a free one)"),
    Option("show-system-tables", "bool", False, "list the performance tables (tickwire.update_performance, ...) with "
                                                "the others; they are reachable by name either way"),
    Option("data-dir", "str", None, "make append, keyed and ring tables durable in DIR: a restart brings them back "
                                    "(default: in memory only)", metavar="DIR"),
    Option("fsync", "words", ("cycle",), "when journals reach the disk: 'cycle' (before each cycle applies its "
                                         "input; a write acknowledged is on disk), 'interval MS', or 'off'",
           metavar="POLICY"),
    Option("gc-young", "int", 20_000, "allocations between Python's young garbage collections (Python's own "
                                      "default is 700; fewer collections, fewer pauses of every thread)",
           metavar="N"),
    Option("duration", "float", None, "stop after this many seconds", metavar="SECONDS"),
    Option("log-level", "choice", "info", "what to log (debug also prints tracebacks of startup errors)",
           choices=LOG_LEVELS),
    Option("log-format", "choice", "text", "log lines as text, or as JSON objects one a line", choices=LOG_FORMATS),
    # demo only
    Option("no-spark", "bool", False, "no Spark pipeline: the Python ticker's tables only", commands=("demo",)),
    Option("no-server", "bool", False, "run the tables without serving them", commands=("demo",)),
    Option("status-interval", "float", None, "print the tables' sizes every SECONDS (default: never)",
           commands=("demo",), metavar="SECONDS"),
    Option("append-rows", "int", None, "keep the last N rows of the demo's append tables (ticking_append, "
                                       "spark_trades), as ring tables, for a demo that runs for days in bounded "
                                       "memory (default: every row)", commands=("demo",), metavar="N"),
    # serve only
    Option("replicate", "str", None, "follow these tables of other Barrage servers (tickwire or Deephaven) as "
                                     "local tables (=LOCAL: under another name)", commands=("serve",),
           metavar="HOST:PORT/TABLE[=LOCAL][,...]"),
    Option("history", "str", None, "serve Hive-partitioned Parquet datasets (a path, file://... or s3://bucket/prefix; "
                                   "S3 endpoint and credentials from AWS_*) as tables NAME, history plus the rows "
                                   "written to NAME afterwards; a NAME alone: its own locations, merged under "
                                   "--data-dir's Systems/", commands=("serve",), metavar="NAME[=URI][,...]"),
    Option("merge-at", "str", None, "each day at HH:MM (UTC), merge every history table's intraday dates before the "
                                    "day's into locations (needs --data-dir)", commands=("serve",), metavar="HH:MM"),
    Option("history-refresh", "float", None, "look for new files in the --history datasets every SECONDS (default: "
                                             "only at start)", commands=("serve",), metavar="SECONDS"),
    Option("fanout-workers", "int", None, "serve subscribers from N more processes that share --port (gRPC only "
                                          "there: browsers need --web-port): each serves subscriptions to tables "
                                          "from replicas of its own and passes every other call to this process",
           commands=("serve",), metavar="N"),
    Option("worker-of", "str", None, "serve as a fan-out worker of the engine process at HOST:PORT (what "
                                     "--fanout-workers starts)", commands=("serve",), metavar="HOST:PORT"),
    Option("upstream-psk", "str", None, "pre-shared key for the --replicate servers", commands=("serve",),
           secret=True),
    Option("forward-key", "str", None, "a key shared by an engine process and its fan-out workers (what "
                                       "--fanout-workers makes for the ones it starts): a worker passes each "
                                       "forwarded call's client address under it, and the engine process logs "
                                       "that address instead of the worker's", commands=("serve",), secret=True),
    Option("upstream-tls", "bool", False, "connect to the --replicate servers with TLS", commands=("serve",)),
    Option("staging-limit-mb", "int", 256, "MiB one producer of exactly-once writes (Spark's tickwire data source, a "
                                           "DoPut naming a transaction) may have staged; uploads beyond it wait",
           commands=("serve",), metavar="MIB"),
    Option("staging-ttl", "float", 600.0, "seconds an uncommitted staged batch lives after its last write",
           commands=("serve",), metavar="SECONDS"),
)


def options_for(command: str) -> list[Option]:
    return [o for o in OPTIONS if command in o.commands]


def _shown(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return " ".join(str(v) for v in value)
    return str(value)


def opposite(o: Option) -> str:
    """The flag that turns switch `o` off: --web for --no-web, --no-upstream-tls for --upstream-tls."""
    return "--" + (o.name[3:] if o.name.startswith("no-") else "no-" + o.name)


class _Unset(argparse.Action):
    """A flag that unsets options (`dests`): their value is None, whatever the environment or the
    file says."""

    def __init__(self, option_strings, dest, dests=(), **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.dests = tuple(dests)

    def __call__(self, parser, namespace, values, option_string=None):
        for dest in self.dests:
            setattr(namespace, dest, None)


def add_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Adds `command`'s options to `parser`. Nothing is defaulted here (argparse.SUPPRESS): the
    namespace holds only the flags given, so that `resolve` can tell them from the defaults.
    Every switch gets its opposite and every option unset by default a `--no-` flag that unsets
    it, so that a flag can undo what the environment or the file set."""
    parser.add_argument("--config", default=argparse.SUPPRESS, metavar="PATH",
                        help=f"read options from this TOML file (env {ENV_PREFIX}CONFIG)")
    parser.add_argument("--print-config", action="store_true", default=argparse.SUPPRESS,
                        help="print the effective options (keys masked) and where each came from, then exit")
    names = {o.name for o in options_for(command)}
    for o in options_for(command):
        default = "" if o.default in (None, False) else f"; default: {_shown(o.default)}"
        helptext = f"{o.help} (env {o.env}{default})".replace("%", "%%")
        if o.kind == "bool":
            parser.add_argument(o.flag, action="store_true", dest=o.dest, default=argparse.SUPPRESS, help=helptext)
            parser.add_argument(opposite(o), action="store_false", dest=o.dest, default=argparse.SUPPRESS,
                                help=f"the opposite of {o.flag}, whatever {o.env} or the config file say")
            continue
        if o.default is None:
            parser.add_argument("--no-" + o.name, action=_Unset, dests=(o.dest,), dest="_unset_" + o.dest,
                                default=argparse.SUPPRESS,
                                help=f"leave {o.flag} unset, whatever {o.env} or the config file say")
        if o.kind == "words":
            parser.add_argument(o.flag, nargs="+", default=argparse.SUPPRESS, metavar=o.metavar, help=helptext)
        else:
            parser.add_argument(o.flag, default=argparse.SUPPRESS,
                                metavar=o.metavar or (None if o.choices else o.dest.upper()),
                                choices=o.choices or None, help=helptext)
    if {"tls-cert", "tls-key"} <= names:
        parser.add_argument("--no-tls", action=_Unset, dests=("tls_cert", "tls_key"), dest="_unset_tls",
                            default=argparse.SUPPRESS,
                            help="serve without TLS: unsets --tls-cert and --tls-key, whatever the environment or "
                                 "the config file say")


# -- parsing and checking ---------------------------------------------------------------------------------
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _convert(o: Option, raw: Any, source: str) -> Any:
    """`raw` (a flag's or variable's string, or a TOML value) as the option's type, checked."""
    where = f"{o.flag} {_shown(raw)!s}" if source == "flag" else f"{o.name} = {raw!r} ({source})"

    def fail(why: str) -> ConfigError:
        return ConfigError(f"{where}: {why}")

    if o.kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise fail("want true or false")
    if o.kind == "words":
        words = raw.split() if isinstance(raw, str) else raw
        if not isinstance(words, (list, tuple)) or not words:
            raise fail("want a policy such as 'cycle', 'interval 50' or 'off'")
        return tuple(str(w) for w in words)
    if raw is None:
        return None
    if o.kind in ("int", "port"):
        if isinstance(raw, bool) or isinstance(raw, float):
            raise fail("want a whole number")
        try:
            value = int(str(raw).strip().replace("_", ""))
        except ValueError:
            raise fail("want a whole number") from None
        if o.kind == "port" and not 0 <= value <= 65535:
            raise fail("a port is 1-65535, or 0 to pick a free one")
        if o.kind == "int" and value <= 0:
            raise fail("want a positive number")
        return value
    if o.kind == "float":
        if isinstance(raw, bool):
            raise fail("want a number")
        try:
            number = float(str(raw).strip())
        except ValueError:
            raise fail("want a number") from None
        if not number > 0 or number != number or number == float("inf"):
            raise fail("want a number above 0")
        return number
    if not isinstance(raw, str):
        raise fail("want a string")
    if o.kind == "choice":
        choice = raw.strip().lower()
        if choice not in o.choices:
            raise fail(f"want one of {', '.join(o.choices)}")
        return choice
    if o.kind == "file":
        path = Path(raw).expanduser()
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as exc:
            raise fail(f"cannot read it: {exc.strerror or exc}") from None
        return str(path)
    if o.secret and not raw:
        raise fail("an empty key")
    return raw


def _load_toml(path: str, command: str) -> dict[str, Any]:
    """{option name: value} of the TOML file for `command` (its table over the top-level keys)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            raise ConfigError(f"config file {path}: reading TOML needs Python 3.11 or `pip install tomli`") from None
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None
    known = {o.name for o in OPTIONS}
    out: dict[str, Any] = {}
    sections = {"serve", "demo"}
    for scope in (None, command):
        table = data if scope is None else data.get(scope, {})
        if not isinstance(table, dict):
            raise ConfigError(f"config file {path}: [{scope}] must be a table")
        for key, value in table.items():
            if scope is None and key in sections:
                continue
            name = key.replace("_", "-")
            if name not in known:
                raise ConfigError(f"config file {path}: unknown option {key!r}" + (f" in [{scope}]" if scope else ""))
            out[name] = value
    return out


@dataclass
class Settings:
    """The effective options of one command: `values` by dest name, `sources` saying where each
    came from ("flag", "env TICKWIRE_X", "file PATH", "default")."""

    command: str
    values: dict[str, Any]
    sources: dict[str, str]
    config_path: Optional[str] = None
    print_config: bool = False

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None


def resolve(command: str, args: argparse.Namespace, environ: Optional[dict[str, str]] = None) -> Settings:
    """The effective options of `command`: flags > environment > file > defaults, checked."""
    env = os.environ if environ is None else environ
    given = vars(args)
    config_path = given.get("config") or env.get(ENV_PREFIX + "CONFIG") or None
    file_values = _load_toml(config_path, command) if config_path else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for o in options_for(command):
        if o.dest in given:
            raw, source = given[o.dest], "flag"
        elif o.env in env:
            raw, source = env[o.env], f"env {o.env}"
        elif o.name in file_values:
            raw, source = file_values[o.name], f"file {config_path}"
        else:
            values[o.dest], sources[o.dest] = o.default, "default"
            continue
        values[o.dest], sources[o.dest] = _convert(o, raw, source), source
    if file_values:
        unused = sorted(set(file_values) - {o.name for o in options_for(command)})
        if unused:
            raise ConfigError(f"config file {config_path}: {', '.join(unused)} is not an option of "
                              f"`tickwire {command}`")
    if (values.get("tls_cert") is None) != (values.get("tls_key") is None):
        missing = "--tls-key" if values.get("tls_key") is None else "--tls-cert"
        raise ConfigError(f"TLS needs both --tls-cert and --tls-key; {missing} is missing")
    if values.get("tls_cert") is not None:
        check_tls(values["tls_cert"], values["tls_key"])
    values["fsync"] = list(values["fsync"])
    return Settings(command, values, sources, config_path, bool(given.get("print_config")))


def check_tls(cert: str, key: str) -> None:
    """ConfigError unless `cert` is a PEM certificate (chain) and `key` its private key: grpc
    would only say "Failed to bind", after C-level lines of its own on stderr."""
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        why = "the key does not match the certificate" if "KEY_VALUES_MISMATCH" in str(exc) else \
            "not a PEM certificate and its PEM private key"
        raise ConfigError(f"--tls-cert {cert} / --tls-key {key}: {why} ({exc.reason or exc})") from None
    except OSError as exc:
        raise ConfigError(f"--tls-cert {cert} / --tls-key {key}: {exc.strerror or exc}") from None


def mask(secret: Optional[str]) -> Optional[str]:
    """A key as it may be shown: its first two characters and ***."""
    if secret is None:
        return None
    return (secret[:2] if len(secret) > 4 else "") + "***"


def render(settings: Settings) -> str:
    """The effective options as TOML (usable as a --config file), each with where it came from."""
    lines = [f"# tickwire {settings.command}: effective options"
             + (f" (config file {settings.config_path})" if settings.config_path else "")]
    for o in options_for(settings.command):
        value = settings.values[o.dest]
        source = settings.sources[o.dest]
        if o.secret and value is not None:
            value = mask(value)
        if value is None:
            lines.append(f"# {o.name} = (unset)  # {source}")
            continue
        if o.kind == "words":
            text = '"' + " ".join(value) + '"'
        elif isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        else:
            text = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
        lines.append(f"{o.name} = {text}  # {source}")
    return "\n".join(lines)


def describe_error(exc: BaseException) -> str:
    """One line for a startup error."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text



def probe_ports(host: str, ports: dict[str, Optional[int]]) -> None:
    """Checks that `host` can listen on each named port (None and 0 are skipped) by binding a
    plain socket and closing it, before anything starts (the demo's Spark takes ~30 s): OSError
    with one line naming the option when a port is taken or the address is not local."""
    import errno
    import socket

    for option, port in ports.items():
        if not port:
            continue
        where = f"{host}:{port}"
        try:
            infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise OSError(f"cannot listen on {where} ({option}): unknown host ({exc.strerror})") from None
        family, socktype, proto, _name, addr = infos[0]
        s = socket.socket(family, socktype, proto)
        try:
            # as servers bind: SO_REUSEADDR lets a port in TIME_WAIT through, never one a server listens on
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                why = "the port is in use (another server? pick another with " + option + ")"
            elif exc.errno == errno.EACCES:
                why = "permission denied (ports below 1024 need privileges)"
            elif exc.errno == errno.EADDRNOTAVAIL:
                why = "the address is not one of this machine's"
            else:
                why = exc.strerror or str(exc)
            raise OSError(f"cannot listen on {where} ({option}): {why}") from None
        finally:
            s.close()


def durability(words):
    """The --fsync policy as the engine's Durability; ConfigError for anything else."""
    from tickwire.server.engine.config import Durability

    words = list(words)
    if words == ["cycle"] or words == ["off"]:
        return Durability(fsync=words[0])
    if len(words) == 2 and words[0] == "interval" and words[1].isdigit() and int(words[1]) > 0:
        return Durability(fsync="interval", fsync_interval_ms=int(words[1]))
    raise ConfigError(f"--fsync {' '.join(words)}: use 'cycle', 'interval MS' (a positive number) or 'off'")


def parse_history(text: str) -> list[tuple[str, str]]:
    """`--history NAME=URI[,NAME...]` as (name, uri) pairs, the URI "" for a NAME alone (the table's
    own locations in the data directory's Systems tree); ConfigError names a malformed one."""
    out = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        name, eq, uri = item.partition("=")
        if not name.strip() or (eq and not uri.strip()):
            raise ConfigError(f"--history {item!r}: use NAME=URI (a path, file://... or s3://bucket/prefix), or NAME "
                              f"alone for its own locations under --data-dir")
        out.append((name.strip(), uri.strip()))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"--history names a table twice: {', '.join(twice)}")
    return out


def server_config(s: Settings):
    """The ServerConfig (tickwire.server.config) of a command's effective options: the one place
    where options become a server's configuration. Options the command does not have keep their
    defaults."""
    from tickwire.server.adapters.replica import parse_replicate
    from tickwire.server.config import ServerConfig
    from tickwire.server.engine.config import EngineConfig, StagingLimits

    v = s.values
    staging = StagingLimits()
    if "staging_limit_mb" in v:
        limit = v["staging_limit_mb"] << 20  # positive: checked by _convert
        staging = StagingLimits(producer_bytes=limit, total_bytes=max(limit, staging.total_bytes),
                                ttl_s=v["staging_ttl"])
    replicate: tuple[str, ...] = ()
    if v.get("replicate"):
        try:
            replicate = tuple(str(up) for up in parse_replicate(v["replicate"]))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    history: tuple[tuple[str, str], ...] = ()
    if v.get("history"):
        history = tuple(parse_history(v["history"]))
    engine = EngineConfig(interval_ms=v["interval_ms"], data_dir=v["data_dir"], durability=durability(v["fsync"]),
                          staging=staging)
    try:
        return ServerConfig(host=v["host"], port=v["port"], psk=v["psk"], tls_cert=v["tls_cert"], tls_key=v["tls_key"],
                            web=not v["no_web"], web_port=v["web_port"], web_assets=v["web_assets"],
                            metrics_port=v["metrics_port"], show_system_tables=v["show_system_tables"],
                            max_inbound_message_size=v["max_inbound_message_size"], replicate=replicate,
                            upstream_psk=v.get("upstream_psk"), upstream_tls=bool(v.get("upstream_tls")),
                            forward_key=v.get("forward_key"),
                            history=history, history_refresh_s=v.get("history_refresh"),
                            merge_at=v.get("merge_at"), engine=engine)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
