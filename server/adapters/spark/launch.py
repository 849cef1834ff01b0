"""A local SparkSession set up for tickwire's sinks: loopback only, quiet, few shuffle partitions,
and a checkpoint filesystem that does not fork a process per file.

Without Hadoop's native library, Spark's stock local filesystem runs `chmod` (and `ls`,
`readlink`) in a child process for every checkpoint file it writes or inspects: about 90 ms of
every micro-batch on a small machine. `NoForkLocalFileSystem.java` (next to this module) answers
those calls through java.nio and stays a checksummed `LocalFileSystem`, which Spark's RocksDB
state store requires. It is compiled with `javac` against pyspark's jars on first use, into
`~/.cache/tickwire/spark-fs/<digest>/` (or `$TICKWIRE_CACHE_DIR`, or `$XDG_CACHE_HOME/tickwire`),
and registered through `spark.hadoop.fs.file.impl` (FileSystem API),
`spark.hadoop.fs.AbstractFileSystem.file.impl` (FileContext API, used by the checkpoint file
manager) and the driver class path. Without `javac` the session falls back to Hadoop's
`RawLocalFileSystem` (no checksum files, `vfork` process launching; it cannot serve the RocksDB
state store).

Launch-time settings (class path, JVM options) are fixed by the first session of a process,
even after `spark.stop()`; a later `spark_session` in the same process reuses that JVM.

Quiet (the default): the JVM logs errors only (`log4j2.properties`, next to this module), less
the lines Spark writes about a micro-batch write that `StreamingQuery.stop()` interrupted; and
the EOFError traceback that PySpark's accumulator server prints when the JVM's end of its
socket closes (a query thread interrupted while the driver talks to it, or the JVM's exit) is
logged at DEBUG instead (`quiet_accumulator_server`).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Mapping, Optional

__all__ = ["spark_session", "spark_conf", "compile_filesystem", "cache_dir", "quiet_accumulator_server",
           "FILESYSTEMS", "NOFORK_FS_CLASS", "NOFORK_AFS_CLASS", "RAW_FS_CLASS"]

log = logging.getLogger(__name__)

NOFORK_FS_CLASS = "tickwire.hadoop.NoForkLocalFileSystem"
NOFORK_AFS_CLASS = "tickwire.hadoop.NoForkLocalFileSystem$Fs"
RAW_FS_CLASS = "org.apache.hadoop.fs.RawLocalFileSystem"
RAW_AFS_CLASS = "org.apache.hadoop.fs.local.RawLocalFs"
FILESYSTEMS = ("auto", "nofork", "raw", "stock")

_HERE = Path(__file__).resolve().parent
JAVA_SOURCE = _HERE / "NoForkLocalFileSystem.java"
LOG4J_QUIET = _HERE / "log4j2.properties"

# what the first session of this process launched its JVM with ("nofork", "raw" or "stock")
_launched_filesystem: Optional[str] = None
# the accumulator servers whose EOF tracebacks are logged at DEBUG (quiet_accumulator_server)
_quieted: "weakref.WeakSet[object]" = weakref.WeakSet()


def cache_dir() -> Path:
    """Where compiled helper classes are kept."""
    env = os.environ.get("TICKWIRE_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tickwire"


def _pyspark_jars() -> Path:
    import pyspark

    jars = Path(pyspark.__file__).resolve().parent / "jars"
    if not jars.is_dir():
        raise RuntimeError(f"pyspark's jars are not at {jars}")
    return jars


def compile_filesystem(cache: Optional[Path] = None, javac: Optional[str] = None) -> Optional[Path]:
    """The class directory holding the compiled `NoForkLocalFileSystem`, compiling it on first use;
    None (with a warning logged) when `javac` is missing or the compilation fails."""
    import pyspark

    source = JAVA_SOURCE.read_bytes()
    digest = hashlib.sha256(source + pyspark.__version__.encode()).hexdigest()[:16]
    root = Path(cache) if cache is not None else cache_dir()
    out = root / "spark-fs" / digest
    classes = out / "classes"
    if (out / "ok").exists():
        return classes
    javac = javac or shutil.which("javac")
    if javac is None:
        log.warning("javac not found: Spark checkpoints use %s (install a JDK 17 for the faster %s)",
                    RAW_FS_CLASS, NOFORK_FS_CLASS)
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="build-", dir=out.parent))
    try:
        cmd = [javac, "--release", "17", "-nowarn", "-d", str(tmp / "classes"),
               "-cp", str(_pyspark_jars() / "*"), str(JAVA_SOURCE)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            log.warning("compiling %s failed (falling back to %s):\n%s", JAVA_SOURCE.name, RAW_FS_CLASS,
                        done.stderr.strip())
            return None
        (tmp / "ok").write_text(" ".join(cmd) + "\n")
        try:
            os.replace(tmp, out)  # atomic; another process may have finished first
        except OSError:
            if not (out / "ok").exists():
                raise
        return classes
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("compiling %s failed (falling back to %s): %r", JAVA_SOURCE.name, RAW_FS_CLASS, exc)
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _merge_java_options(*parts: Optional[str]) -> str:
    return " ".join(p.strip() for p in parts if p and p.strip())


def spark_conf(app_name: str = "tickwire", conf: Optional[Mapping[str, str]] = None, *, master: str = "local[2]",
               filesystem: str = "auto", quiet: bool = True, shuffle_partitions: int = 2,
               cache: Optional[Path] = None) -> tuple[dict[str, str], str]:
    """The Spark settings `spark_session` applies, and the filesystem chosen ("nofork", "raw" or
    "stock"). `conf` entries win over the defaults, except that JVM options and the driver class
    path are merged."""
    if filesystem not in FILESYSTEMS:
        raise ValueError(f"filesystem must be one of {FILESYSTEMS}, got {filesystem!r}")
    user = {str(k): str(v) for k, v in (conf or {}).items()}
    out: dict[str, str] = {
        "spark.master": master,
        "spark.app.name": app_name,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(int(shuffle_partitions)),
        "spark.sql.session.timeZone": "UTC",
        # strings and binaries with 32-bit offsets, as Deephaven's clients take them
        "spark.sql.execution.arrow.useLargeVarTypes": "false",
    }
    java_opts = []
    class_path = []
    chosen = filesystem
    if filesystem in ("auto", "nofork"):
        classes = compile_filesystem(cache)
        if classes is None:
            if filesystem == "nofork":
                raise RuntimeError(f"{NOFORK_FS_CLASS} is not available (no javac, or it did not compile)")
            chosen = "raw"
        else:
            chosen = "nofork"
            class_path.append(str(classes))
            out["spark.hadoop.fs.file.impl"] = NOFORK_FS_CLASS
            out["spark.hadoop.fs.AbstractFileSystem.file.impl"] = NOFORK_AFS_CLASS
    if chosen == "raw":
        out["spark.hadoop.fs.file.impl"] = RAW_FS_CLASS
        out["spark.hadoop.fs.AbstractFileSystem.file.impl"] = RAW_AFS_CLASS
        java_opts.append("-Djdk.lang.Process.launchMechanism=VFORK")
    if quiet:
        java_opts.append(f"-Dlog4j2.configurationFile={LOG4J_QUIET.as_uri()}")
    # a query stopped while a batch runs makes Spark match its exception text with a recursive
    # regex, which overflows the default thread stack and prints a StackOverflowError
    java_opts.append("-Xss16m")
    opts = _merge_java_options(" ".join(java_opts), user.pop("spark.driver.extraJavaOptions", None))
    if opts:
        out["spark.driver.extraJavaOptions"] = opts
    cp = os.pathsep.join([*class_path, *filter(None, [user.pop("spark.driver.extraClassPath", None)])])
    if cp:
        out["spark.driver.extraClassPath"] = cp
    out.update(user)
    return out, chosen


def _jvm_running() -> bool:
    from pyspark import SparkContext

    return SparkContext._gateway is not None  # noqa: SLF001 - pyspark has no public way to tell its JVM is up


def spark_session(app_name: str = "tickwire", conf: Optional[Mapping[str, str]] = None, *, master: str = "local[2]",
                  filesystem: str = "auto", quiet: bool = True, shuffle_partitions: int = 2,
                  cache: Optional[Path] = None):
    """A SparkSession for tickwire's sinks (classic PySpark, `local[2]` by default).

    `filesystem`: "auto" (the non-forking filesystem, or RawLocalFileSystem without javac),
    "nofork" (required), "raw", or "stock" (Spark's defaults). Sets `SPARK_LOCAL_IP=127.0.0.1`
    and `PYSPARK_PYTHON` (this interpreter) unless they are set. The chosen filesystem is in
    `session.conf.get("spark.tickwire.filesystem")`."""
    global _launched_filesystem
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings, chosen = spark_conf(app_name, conf, master=master, filesystem=filesystem, quiet=quiet,
                                  shuffle_partitions=shuffle_partitions, cache=cache)
    if _jvm_running():
        # the JVM's class path and options are fixed: keep a filesystem class it can load
        launched = _launched_filesystem or "stock"
        if chosen == "nofork" and launched != "nofork":
            if filesystem == "nofork":
                raise RuntimeError("this process's Spark JVM was launched without tickwire's filesystem class; "
                                   "use a new process")
            log.warning("Spark's JVM is already running without %s; using %s", NOFORK_FS_CLASS, RAW_FS_CLASS)
            settings, chosen = spark_conf(app_name, conf, master=master, filesystem="raw", quiet=quiet,
                                          shuffle_partitions=shuffle_partitions, cache=cache)
    else:
        _launched_filesystem = chosen
    settings["spark.tickwire.filesystem"] = chosen
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    quiet_accumulator_server(session)
    return session


def quiet_accumulator_server(session) -> None:
    """Logs at DEBUG, instead of printing a traceback, the end of a connection of the JVM to
    PySpark's accumulator server (a socketserver in this process, `SparkContext._accumulatorServer`).

    The driver's JVM sends the accumulator updates of every Python function it runs over one
    socket channel to that server: the tasks' updates and, in the query's own thread, those of
    the Python data sources' driver-side calls (a streaming write's commit and abort). A Java
    channel is closed when the thread using it is interrupted, as `StreamingQuery.stop()`
    interrupts the query's thread, and the JVM's exit closes it too; the server's handler then
    reads end-of-file and raises EOFError, which socketserver prints with its traceback. Only the
    update of the interrupted call is lost (the call is being stopped); the JVM opens a new
    connection for the next one. Other errors are printed as before."""
    sc = getattr(session, "sparkContext", None)
    server = getattr(sc, "_accumulatorServer", None)  # classic PySpark only
    if server is None or server in _quieted:
        return
    printing = server.handle_error

    def handle_error(request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (EOFError, ConnectionError)):
            log.debug("the JVM closed its connection to PySpark's accumulator server (%s)", type(exc).__name__,
                      exc_info=True)
            return
        printing(request, client_address)

    server.handle_error = handle_error
    _quieted.add(server)
