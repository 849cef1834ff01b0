"""The browser code tickwire serves, read at run time from Deephaven's own web build.

Deephaven's JavaScript API (`jsapi/dh-core.js`) and its single-table grid page (`iframe/widget/`)
ship inside the `deephaven-server` wheel, in `deephaven_server/jars/deephaven-web-<version>.jar`
under `META-INF/resources/`. They are under the Deephaven Community License, so tickwire never
carries a copy: it opens the installed jar (or a directory given with `--web-assets`) and serves
files from it as they are.

    assets = locate_assets()          # None when neither the package nor a path is there
    data = assets.read("jsapi/dh-core.js")
"""
from __future__ import annotations

import importlib.util
import mimetypes
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional, Union

__all__ = ["Asset", "AssetSource", "JarAssets", "DirectoryAssets", "locate_assets", "SERVED_PREFIXES",
           "MISSING_ASSETS"]

#: The parts of Deephaven's web build tickwire serves: the JS API and the grid page. The full web
#: UI (`ide/`) needs Deephaven's console service, which tickwire does not have.
SERVED_PREFIXES = ("jsapi/", "iframe/widget/")

RESOURCES = "META-INF/resources/"

MISSING_ASSETS = ("The browser pages come from Deephaven's web build, which is not installed here. "
                  "Install it with `pip install 'tickwire[web]'` (the deephaven-server package, about 300 MB) "
                  "or start the server with `--web-assets PATH` (a deephaven-web-*.jar or a directory holding "
                  "jsapi/ and iframe/widget/). Flight, Barrage and every other client work without it.")

_TYPES = {".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css", ".json": "application/json",
          ".svg": "image/svg+xml", ".woff2": "font/woff2", ".woff": "font/woff", ".html": "text/html",
          ".map": "application/json", ".png": "image/png", ".ico": "image/x-icon", ".wasm": "application/wasm"}


@dataclass(frozen=True)
class Asset:
    data: bytes
    content_type: str
    etag: str


def content_type(path: str) -> str:
    suffix = PurePosixPath(path).suffix.lower()
    return _TYPES.get(suffix) or mimetypes.guess_type(path)[0] or "application/octet-stream"


def _clean(path: str) -> Optional[str]:
    """A served relative path, or None for anything outside the served parts (`..`, absolute,
    backslashes, other folders)."""
    if "\\" in path or "\x00" in path:
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        return None
    rel = "/".join(parts)
    if path.endswith("/") or not parts:
        rel = (rel + "/index.html") if rel else "index.html"
    return rel if rel.startswith(SERVED_PREFIXES) else None


class AssetSource:
    """Where the files come from; `read(path)` gives an Asset or None (not there, or not served)."""

    description = ""

    def read(self, path: str) -> Optional[Asset]:
        rel = _clean(path)
        return None if rel is None else self._read(rel)

    def _read(self, rel: str) -> Optional[Asset]:  # pragma: no cover - abstract
        raise NotImplementedError

    def exists(self, path: str) -> bool:
        rel = _clean(path)
        return rel is not None and self._exists(rel)

    def _exists(self, rel: str) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError


class JarAssets(AssetSource):
    """Files under META-INF/resources/ of a deephaven-web jar (read with zipfile, never unpacked)."""

    def __init__(self, jar: Path):
        self.path = Path(jar)
        self._zip = zipfile.ZipFile(self.path)
        self._lock = threading.Lock()  # ZipFile reads share one file handle
        self._entries = {i.filename[len(RESOURCES):]: i for i in self._zip.infolist()
                         if i.filename.startswith(RESOURCES) and not i.is_dir()}
        if "jsapi/dh-core.js" not in self._entries:
            raise ValueError(f"{self.path} holds no META-INF/resources/jsapi/dh-core.js: not a Deephaven web jar")
        self.description = str(self.path)

    def _exists(self, rel: str) -> bool:
        return rel in self._entries

    def _read(self, rel: str) -> Optional[Asset]:
        info = self._entries.get(rel)
        if info is None:
            return None
        with self._lock:
            data = self._zip.read(info)
        return Asset(data, content_type(rel), f'"{info.CRC:08x}-{info.file_size:x}"')


class DirectoryAssets(AssetSource):
    """Files of a directory laid out like the jar's META-INF/resources/ (jsapi/, iframe/widget/)."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        if not (self.root / "jsapi" / "dh-core.js").is_file():
            raise ValueError(f"{self.root} holds no jsapi/dh-core.js: not a Deephaven web directory")
        self.description = str(self.root)

    def _file(self, rel: str) -> Optional[Path]:
        p = (self.root / rel).resolve()
        return p if p.is_relative_to(self.root) and p.is_file() else None

    def _exists(self, rel: str) -> bool:
        return self._file(rel) is not None

    def _read(self, rel: str) -> Optional[Asset]:
        p = self._file(rel)
        if p is None:
            return None
        st = p.stat()
        return Asset(p.read_bytes(), content_type(rel), f'"{st.st_mtime_ns:x}-{st.st_size:x}"')


def installed_jar() -> Optional[Path]:
    """The deephaven-web jar of the installed `deephaven-server` package, found without importing
    it (importing starts nothing, but needs a JVM binding this side does not use)."""
    spec = importlib.util.find_spec("deephaven_server")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        jars = sorted(Path(loc, "jars").glob("deephaven-web-*.jar"))
        if jars:
            return jars[-1]
    return None


def locate_assets(path: Optional[Union[str, Path]] = None) -> Optional[AssetSource]:
    """The asset source: `path` (a jar or a directory; errors say what is wrong with it), else the
    installed deephaven-server package's jar, else None."""
    if path is not None:
        p = Path(path)
        if p.is_dir():
            return DirectoryAssets(p)
        if p.is_file():
            return JarAssets(p)
        raise ValueError(f"--web-assets {p}: no such file or directory")
    jar = installed_jar()
    return JarAssets(jar) if jar is not None else None
