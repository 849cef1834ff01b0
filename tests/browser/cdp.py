"""Headless Chromium driven over the Chrome DevTools Protocol (CDP), for tests.

    with launch_chromium() as browser:          # pytest.skip()s when no Chromium can be had
        page = browser.new_page()
        page.navigate("http://127.0.0.1:8080/")
        page.evaluate("1 + 1")                   # -> 2 (promises awaited, values returned by value)
        page.wait_for("window.__ready === true", timeout=10, what="the page to get ready")
        page.screenshot(tmp_path / "page.png")
        page.ws_frames()                         # websocket frames seen (direction, opcode, length, head)
        page.close()

The protocol client is ours (aiohttp's websocket client on an asyncio loop in a daemon thread);
the methods of `Browser` and `Page` block. One browser-level websocket carries every page, through
flat sessions (`Target.attachToTarget(flatten=True)`). JavaScript errors -- exceptions thrown by an
evaluated script, uncaught exceptions and console errors of the page -- are kept and appended to
the message of every failure raised here (`Page.diagnostics()`).

Chromium: `$TICKWIRE_CHROMIUM`, else `chromium` / `chromium-browser` / `google-chrome` on PATH or
/usr/bin/chromium. When none is found and we run as root with apt-get, `apt-get install -y
chromium` is tried once; otherwise the caller is skipped with the reason. The flags that turn off
Chromium's background networking matter here: on a machine without network its refused background
connections otherwise disturb it.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import aiohttp

__all__ = ["Browser", "Page", "WsFrame", "CdpError", "JsError", "find_chromium", "chromium_or_skip",
           "launch_chromium", "CHROMIUM_FLAGS"]

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
    "--password-store=basic", "--use-mock-keychain", "--mute-audio", "--hide-scrollbars",
    "--remote-debugging-port=0",
)
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_install_tried: dict[str, Optional[str]] = {}


class CdpError(RuntimeError):
    """A DevTools call failed (its error object), timed out, or the browser went away."""


class JsError(AssertionError):
    """A script evaluated in the page threw (or its promise rejected)."""


# -- finding (or installing) Chromium ----------------------------------------------------------------

def find_chromium() -> Optional[str]:
    """The Chromium executable to use, or None."""
    env = os.environ.get("TICKWIRE_CHROMIUM")
    if env:
        return env if (os.path.isfile(env) or shutil.which(env)) else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.path.isfile("/usr/bin/chromium") else None


def install_chromium() -> Optional[str]:
    """Tries `apt-get install -y chromium` (root only, once per process); None when it worked,
    else why not."""
    if "result" in _install_tried:
        return _install_tried["result"]
    why: Optional[str] = None
    if shutil.which("apt-get") is None:
        why = "no apt-get to install Debian's chromium package"
    elif os.geteuid() != 0:
        why = "not root, cannot run apt-get install -y chromium (install Debian's chromium package)"
    else:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:  # stale package lists: refresh once, try again
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=600)
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if res.returncode != 0:
            why = f"apt-get install -y chromium failed ({res.returncode}): {res.stderr.strip()[-500:]}"
        elif find_chromium() is None:
            why = "apt-get installed chromium but no chromium executable was found"
    _install_tried["result"] = why
    return why


def chromium_or_skip() -> str:
    """The Chromium executable; installs it when possible; else pytest.skip()s with the reason."""
    exe = find_chromium()
    if exe is None:
        why = install_chromium()
        exe = find_chromium()
        if exe is None:
            import pytest

            pytest.skip(f"headless Chromium is not available: {why or 'not found'}")
    return exe


# -- the protocol connection ---------------------------------------------------------------------------

class _Connection:
    """One CDP websocket; runs on the loop thread. Replies are matched by id, events are handed to
    the listener registered for their session id ("" for the browser)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.http: Optional[aiohttp.ClientSession] = None
        self.ws: Optional[aiohttp.ClientWebSocketResponse] = None
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future] = {}
        self.listeners: dict[str, Callable[[str, dict], None]] = {}
        self.reader: Optional[asyncio.Task] = None
        self.closed_why: Optional[str] = None

    async def open(self, url: str) -> None:
        self.http = aiohttp.ClientSession()
        self.ws = await self.http.ws_connect(url, max_msg_size=0, autoping=True)
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                data = json.loads(msg.data)
                if "id" in data:
                    fut = self.pending.pop(data["id"], None)
                    if fut is not None and not fut.done():
                        if "error" in data:
                            fut.set_exception(CdpError(f"{data['error'].get('message')} "
                                                       f"({data['error'].get('data', '')})"))
                        else:
                            fut.set_result(data.get("result", {}))
                else:
                    listener = self.listeners.get(data.get("sessionId", ""))
                    if listener is not None:
                        try:
                            listener(data.get("method", ""), data.get("params", {}))
                        except Exception:  # noqa: BLE001 - a broken listener must not stop the reader
                            pass
            self.closed_why = "the browser closed the DevTools connection"
        except Exception as exc:  # noqa: BLE001 - whatever ends the connection is reported to every waiter
            self.closed_why = f"the DevTools connection failed: {exc!r}"
        finally:
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(CdpError(self.closed_why or "connection closed"))
            self.pending.clear()

    async def call(self, method: str, params: Optional[dict] = None, session_id: Optional[str] = None,
                   timeout: float = 30.0) -> dict:
        if self.ws is None or self.ws.closed:
            raise CdpError(self.closed_why or "not connected")
        msg_id = next(self.ids)
        fut = self.loop.create_future()
        self.pending[msg_id] = fut
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session_id:
            msg["sessionId"] = session_id
        await self.ws.send_str(json.dumps(msg))
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise CdpError(f"{method} got no answer within {timeout:.0f} s") from None
        finally:
            self.pending.pop(msg_id, None)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.reader is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.reader, 5)
        if self.http is not None:
            await self.http.close()


# -- pages -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WsFrame:
    """One websocket message seen by the page. `length` is the payload's length in bytes (after
    permessage-deflate decompression: what the application got); `head` holds the first bytes of a
    received payload and the whole payload of a sent one."""

    t: float  # time.monotonic() when the event arrived
    direction: str  # "recv" | "sent"
    opcode: int  # 1 text, 2 binary
    length: int
    head: bytes
    request_id: str
    url: str

    @property
    def stream_id(self) -> Optional[int]:
        """grpc-websockets-multiplex: the stream id (first 4 bytes, big-endian, without the top bit)."""
        if self.opcode != 2 or len(self.head) < 4:
            return None
        return int.from_bytes(self.head[:4], "big") & 0x7FFFFFFF

    @property
    def closes(self) -> bool:
        """grpc-websockets-multiplex: the top bit of the stream id (this side closes the stream)."""
        return self.opcode == 2 and len(self.head) >= 4 and bool(self.head[0] & 0x80)


class Page:
    """One tab (a CDP target attached through a flat session). Methods block; every failure's
    message ends with the page's JavaScript errors and recent console output."""

    RECV_HEAD = 64  # bytes of each received websocket payload kept

    def __init__(self, browser: "Browser", target_id: str, session_id: str):
        self.browser = browser
        self.target_id = target_id
        self.session_id = session_id
        self.closed = False
        self._lock = threading.Lock()
        self._console: list[str] = []
        self._exceptions: list[str] = []
        self._frames: list[WsFrame] = []
        self._sockets: dict[str, str] = {}  # websocket request id -> url
        self._load_event: Optional[asyncio.Event] = None

    # events arrive on the loop thread
    def on_event(self, method: str, params: dict) -> None:
        """An event of this page's DevTools session (the browser's connection calls it, in order)."""
        if method == "Network.webSocketFrameReceived" or method == "Network.webSocketFrameSent":
            resp = params.get("response", {})
            opcode = int(resp.get("opcode", 0))
            payload = resp.get("payloadData", "")
            data = base64.b64decode(payload) if opcode == 2 else payload.encode("utf-8", "replace")
            recv = method.endswith("Received")
            frame = WsFrame(time.monotonic(), "recv" if recv else "sent", opcode, len(data),
                            bytes(data[:self.RECV_HEAD]) if recv else bytes(data), params.get("requestId", ""),
                            self._sockets.get(params.get("requestId", ""), ""))
            with self._lock:
                self._frames.append(frame)
        elif method == "Network.webSocketCreated":
            with self._lock:
                self._sockets[params.get("requestId", "")] = params.get("url", "")
        elif method == "Network.webSocketFrameError":
            with self._lock:
                self._console.append(f"[websocket error] {params.get('errorMessage')}")
        elif method == "Runtime.consoleAPICalled":
            parts = []
            for arg in params.get("args", []):
                parts.append(str(arg["value"]) if "value" in arg else str(arg.get("description", arg.get("type"))))
            with self._lock:
                self._console.append(f"[console.{params.get('type')}] {' '.join(parts)}")
        elif method == "Runtime.exceptionThrown":
            with self._lock:
                self._exceptions.append(_describe_exception(params.get("exceptionDetails", {})))
        elif method == "Log.entryAdded":
            e = params.get("entry", {})
            with self._lock:
                self._console.append(f"[log.{e.get('level')}] {e.get('text')} {e.get('url', '')}".rstrip())
        elif method == "Page.loadEventFired":
            if self._load_event is not None:
                self._load_event.set()

    def cdp(self, method: str, params: Optional[dict] = None, timeout: float = 30.0) -> dict:
        """One DevTools call in this page's session; its result."""
        if self.closed:
            raise CdpError(f"{method}: the page is closed")
        try:
            return self.browser.run(self.browser.conn.call(method, params, self.session_id, timeout), timeout + 5)
        except CdpError as exc:
            raise CdpError(f"{exc}{self.diagnostics()}") from None

    # -- diagnostics ---------------------------------------------------------------------------
    def console(self) -> list[str]:
        with self._lock:
            return list(self._console)

    def exceptions(self) -> list[str]:
        with self._lock:
            return list(self._exceptions)

    def diagnostics(self, lines: int = 25) -> str:
        """The page's uncaught exceptions and its last console lines, for assertion messages."""
        exc, con = self.exceptions(), self.console()
        out = []
        if exc:
            out.append("page exceptions:\n  " + "\n  ".join(e[:2000] for e in exc[-10:]))
        if con:
            out.append(f"console (last {min(lines, len(con))} of {len(con)}):\n  "
                       + "\n  ".join(c[:1000] for c in con[-lines:]))
        return ("\n" + "\n".join(out)) if out else ""

    # -- navigation and scripts ------------------------------------------------------------------
    def navigate(self, url: str, *, wait_load: bool = True, timeout: float = 30.0) -> None:
        async def go():
            self._load_event = asyncio.Event()
            res = await self.browser.conn.call("Page.navigate", {"url": url}, self.session_id, timeout)
            if res.get("errorText"):
                raise CdpError(f"navigating to {url}: {res['errorText']}")
            if wait_load:
                try:
                    await asyncio.wait_for(self._load_event.wait(), timeout)
                except asyncio.TimeoutError:
                    raise CdpError(f"{url} did not fire its load event within {timeout:.0f} s") from None

        try:
            self.browser.run(go(), timeout * 2 + 5)
        except CdpError as exc:
            raise CdpError(f"{exc}{self.diagnostics()}") from None

    def evaluate(self, expression: str, *, await_promise: bool = True, timeout: float = 30.0) -> Any:
        """The value of `expression` in the page (a promise is awaited), returned by value (JSON)."""
        res = self.cdp("Runtime.evaluate", {"expression": expression, "awaitPromise": await_promise,
                                              "returnByValue": True, "userGesture": True}, timeout)
        if "exceptionDetails" in res:
            raise JsError(f"JavaScript error in {expression[:200]!r}:\n"
                          f"{_describe_exception(res['exceptionDetails'])}{self.diagnostics()}")
        return res.get("result", {}).get("value")

    def wait_for(self, expression: str, *, timeout: float = 30.0, interval: float = 0.1,
                 what: Optional[str] = None) -> Any:
        """Polls `expression` until it is truthy; returns that value. On timeout raises
        AssertionError with the last value and the page's diagnostics."""
        end = time.monotonic() + timeout
        last: Any = None
        while True:
            last = self.evaluate(expression, timeout=max(5.0, timeout))
            if last:
                return last
            if time.monotonic() > end:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what or expression!r}; "
                                     f"last value {str(last)[:500]}{self.diagnostics()}")
            time.sleep(interval)

    def add_init_script(self, source: str) -> None:
        """Runs `source` in every document this page loads from now on, before its own scripts."""
        self.cdp("Page.addScriptToEvaluateOnNewDocument", {"source": source})

    def set_viewport(self, width: int, height: int, scale: float = 1.0) -> None:
        """Emulates a window of `width` x `height` CSS pixels (screenshots take that size)."""
        self.cdp("Emulation.setDeviceMetricsOverride", {"width": int(width), "height": int(height),
                                                          "deviceScaleFactor": scale, "mobile": False})

    def screenshot(self, path: Optional[str | os.PathLike] = None) -> bytes:
        """A PNG of the viewport (also written to `path` when given)."""
        res = self.cdp("Page.captureScreenshot", {"format": "png"}, timeout=60)
        png = base64.b64decode(res["data"])
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_bytes(png)
        return png

    # -- websockets ------------------------------------------------------------------------------
    def ws_frames(self, since: float = 0.0) -> list[WsFrame]:
        """The websocket messages seen since `since` (a time.monotonic() value)."""
        with self._lock:
            return [f for f in self._frames if f.t >= since]

    def ws_urls(self) -> list[str]:
        with self._lock:
            return list(self._sockets.values())

    def close(self) -> None:
        if self.closed:
            return
        with contextlib.suppress(Exception):
            self.browser.run(self.browser.conn.call("Target.closeTarget", {"targetId": self.target_id}), 15)
        self.closed = True
        self.browser.conn.listeners.pop(self.session_id, None)


def _describe_exception(details: dict) -> str:
    exc = details.get("exception") or {}
    text = exc.get("description") or exc.get("value") or details.get("text") or "exception"
    where = details.get("url", "")
    if where or details.get("lineNumber") is not None:
        text += f" (at {where}:{details.get('lineNumber', '?')}:{details.get('columnNumber', '?')})"
    return str(text)


# -- the browser ---------------------------------------------------------------------------------------

class Browser:
    """A headless Chromium process and its DevTools connection."""

    def __init__(self, executable: str, *, window: tuple[int, int] = (1280, 800),
                 extra_args: tuple[str, ...] = (), start_timeout: float = 30.0):
        self.executable = executable
        self.profile = Path(tempfile.mkdtemp(prefix="tw_chromium_"))
        self.log_path = self.profile.parent / (self.profile.name + ".log")
        args = [executable, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                f"--window-size={window[0]},{window[1]}", *extra_args, "about:blank"]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cdp-loop", daemon=True)
        self._thread.start()
        self.conn = _Connection(self._loop)
        self.pages: list[Page] = []
        try:
            port, path = self._wait_port(start_timeout)
            self.ws_url = f"ws://127.0.0.1:{port}{path}"
            self.run(self.conn.open(self.ws_url), 15)
            self.version = self.run(self.conn.call("Browser.getVersion"), 15).get("product", "?")
        except BaseException:
            self.close()
            raise

    def _wait_port(self, timeout: float) -> tuple[int, str]:
        port_file = self.profile / "DevToolsActivePort"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise CdpError(f"Chromium exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError, ValueError, IndexError):
                lines = port_file.read_text().split()
                if len(lines) >= 2:
                    return int(lines[0]), lines[1]
            time.sleep(0.05)
        raise CdpError(f"Chromium wrote no DevToolsActivePort within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-limit:].decode("utf-8", "replace")
        except OSError:
            return ""

    def run(self, coro, timeout: float):
        """Runs `coro` on the browser's DevTools loop; its result (CdpError past `timeout`)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            raise CdpError(f"no answer from Chromium within {timeout:.0f} s") from None

    def new_page(self, url: str = "about:blank") -> Page:
        """A new tab, with Page, Runtime, Network and Log events on."""
        target_id = self.run(self.conn.call("Target.createTarget", {"url": "about:blank"}), 30)["targetId"]
        session_id = self.run(self.conn.call("Target.attachToTarget",
                                               {"targetId": target_id, "flatten": True}), 30)["sessionId"]
        page = Page(self, target_id, session_id)
        self.conn.listeners[session_id] = page.on_event  # inline: events are kept in arrival order
        for method, params in (("Page.enable", {}), ("Runtime.enable", {}), ("Log.enable", {}),
                               ("Network.enable", {"maxTotalBufferSize": 0, "maxResourceBufferSize": 0})):
            page.cdp(method, params)
        self.pages.append(page)
        if url != "about:blank":
            page.navigate(url)
        return page

    def close(self) -> None:
        for page in self.pages:
            page.closed = True
        if self._loop.is_running():
            with contextlib.suppress(BaseException):
                self.run(self.conn.call("Browser.close", timeout=5), 8)
            with contextlib.suppress(BaseException):
                self.run(self.conn.close(), 8)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        for sig in (signal.SIGTERM, signal.SIGKILL):  # the whole group: Chromium forks helpers
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def launch_chromium(**kwargs) -> Iterator[Browser]:
    """A running headless Chromium (pytest.skip()s when none can be found or installed)."""
    browser = Browser(chromium_or_skip(), **kwargs)
    try:
        yield browser
    finally:
        browser.close()
