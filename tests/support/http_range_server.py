"""A local HTTP file server for tests: Range support (or not), redirects, stalls, a request log.

Serves the files of one directory under ``/files/NAME``.  ``/resolve/main/NAME`` answers
``302 Found`` to ``/files/NAME`` (like Hugging Face's resolve links redirect to a CDN);
``redirect_host`` makes that redirect name another host (e.g. ``localhost`` for the same server),
so that tests can check which headers cross hosts, and ``redirect_to`` makes it name any URL (an
``ftp://`` one, another server's).  ``drip`` sends bodies one byte per ``drip`` seconds after the
headers (a server that trickles), ``drip_headers`` a header that never ends; ``tls`` serves https
with a self-signed certificate for 127.0.0.1/localhost (:func:`tls_cert_file`, for
``SSL_CERT_FILE``).  Every request's headers are in :attr:`RangeServer.log` (what token was sent
where).  Binds 127.0.0.1 on a free port::

    with RangeServer(tmp_path) as srv:
        open_model(srv.url("model.gguf"))
        assert srv.bytes_sent() < size
"""

from __future__ import annotations

import re
import ssl
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")
_CHUNK = 64 * 1024


@dataclass
class LoggedRequest:
    """One request as the server saw it, and what it answered.

    It is logged before the client can see the answer (so a client that has its answer always
    finds its request in the log, in order); ``bytes_sent`` is filled in as the body goes out."""

    method: str
    path: str
    headers: dict[str, str]
    status: int
    range: tuple[int, int] | None = None  # inclusive byte range asked for, if any
    bytes_sent: int = 0  # body bytes actually written to the socket


@dataclass
class _Config:
    root: Path
    ranges: bool = True
    redirect_host: str | None = None
    stall: threading.Event | None = None  # when set, requests hang until the server stops
    require_token: str | None = None  # answer 401/403 unless this bearer token is sent
    content_length: bool = True  # False: full-body answers end by closing the connection
    redirect_to: str | None = None  # /resolve/main/NAME answers 302 to this URL
    drip: float | None = None  # seconds between body bytes
    drip_headers: float | None = None  # seconds between the bytes of a status line that never ends
    log: list[LoggedRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass  # keep test output quiet

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, *, body: bool) -> None:
        cfg = self.server.config
        if cfg.stall is not None:
            cfg.stall.wait()
            return
        if cfg.drip_headers is not None:
            self._drip_status_line(cfg.drip_headers)
            return
        path = unquote(urlsplit(self.path).path)
        if path.startswith("/resolve/main/"):
            self._redirect(path.removeprefix("/resolve/main/"))
            return
        if cfg.require_token is not None and not self._authorized(cfg.require_token):
            self._status_only(401 if "Authorization" not in self.headers else 403)
            return
        file = self._file(path)
        if file is None:
            self._status_only(404)
            return
        self._send_file(file, body=body)

    def _drip_status_line(self, every: float) -> None:
        """``HTTP/1.1 200 OK``, then a header line that grows a byte every ``every`` seconds."""
        self._log(200)
        try:
            self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while not self.server.stopping.wait(every):
                self.wfile.write(b"a")
                self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True

    def _authorized(self, token: str) -> bool:
        return self.headers.get("Authorization") == f"Bearer {token}"

    def _file(self, path: str) -> Path | None:
        if not path.startswith("/files/"):
            return None
        name = path.removeprefix("/files/")
        if not name or "/" in name or name.startswith("."):
            return None
        file = self.server.config.root / name
        return file if file.is_file() else None

    def _redirect(self, name: str) -> None:
        port = self.server.server_address[1]
        host = self.server.config.redirect_host
        target = f"/files/{name}" if host is None else f"{self.server.scheme}://{host}:{port}/files/{name}"
        target = self.server.config.redirect_to or target
        self._log(302)
        self.send_response(302)
        self.send_header("Location", target)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _status_only(self, status: int, extra: dict[str, str] | None = None) -> None:
        self._log(status)
        self.send_response(status)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send_file(self, file: Path, *, body: bool) -> None:
        size = file.stat().st_size
        asked = self._asked_range(size) if self.server.config.ranges else None
        if asked == "unsatisfiable":
            self._status_only(416, {"Content-Range": f"bytes */{size}"})
            return
        if isinstance(asked, tuple):
            start, end = asked
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        else:
            start, end = 0, size - 1
            self.send_response(200)
        length = end - start + 1
        if self.server.config.content_length or isinstance(asked, tuple):
            self.send_header("Content-Length", str(length))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.send_header("Accept-Ranges", "bytes" if self.server.config.ranges else "none")
        status = 206 if isinstance(asked, tuple) else 200
        entry = self._log(status, asked if isinstance(asked, tuple) else None)
        self.end_headers()
        if body:
            self._copy(file, start, length, entry)

    def _asked_range(self, size: int) -> tuple[int, int] | str | None:
        value = self.headers.get("Range")
        m = _RANGE.match(value or "")
        if m is None:
            return None
        start = int(m[1])
        end = int(m[2]) if m[2] else size - 1
        if start >= size or end < start:
            return "unsatisfiable"
        return start, min(end, size - 1)

    def _copy(self, file: Path, start: int, length: int, entry: LoggedRequest) -> int:
        sent = 0
        with file.open("rb") as f:
            f.seek(start)
            drip = self.server.config.drip
            try:
                while sent < length:
                    if drip is not None:
                        time.sleep(drip)
                        if self.server.stopping.is_set():
                            break
                    chunk = f.read(1 if drip is not None else min(_CHUNK, length - sent))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    self.wfile.flush()
                    sent += len(chunk)
                    entry.bytes_sent = sent
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client stopped reading: that is allowed
        return sent

    def _log(self, status: int, rng: tuple[int, int] | None = None) -> LoggedRequest:
        entry = LoggedRequest(self.command, self.path, dict(self.headers.items()), status, rng)
        with self.server.config.lock:
            self.server.config.log.append(entry)
        return entry


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    config: _Config
    scheme = "http"
    stopping: threading.Event


_CERT: list[Path] = []


def tls_cert_file() -> Path:
    """A self-signed certificate (and key, in the same PEM) for 127.0.0.1 and localhost, made once
    per test process with the openssl command."""
    if not _CERT:
        folder = Path(tempfile.mkdtemp(prefix="range-server-tls-"))
        pem = folder / "cert.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
             "-keyout", str(folder / "key.pem"), "-out", str(pem)],
            check=True, capture_output=True, timeout=60,
        )
        (folder / "both.pem").write_bytes(pem.read_bytes() + (folder / "key.pem").read_bytes())
        _CERT.append(pem)
    return _CERT[0]


class RangeServer:
    """Serves ``root`` on 127.0.0.1; a context manager that starts and stops the server thread."""

    def __init__(
        self,
        root: str | Path,
        *,
        ranges: bool = True,
        redirect_host: str | None = None,
        stall: bool = False,
        require_token: str | None = None,
        content_length: bool = True,
        redirect_to: str | None = None,
        drip: float | None = None,
        drip_headers: float | None = None,
        tls: bool = False,
    ) -> None:
        self.config = _Config(
            Path(root),
            ranges=ranges,
            redirect_host=redirect_host,
            stall=threading.Event() if stall else None,
            require_token=require_token,
            content_length=content_length,
            redirect_to=redirect_to,
            drip=drip,
            drip_headers=drip_headers,
        )
        self.tls = tls
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The port the server listens (or listened) on."""
        if self._port is None:
            raise RuntimeError("server not started")
        return self._port

    @property
    def base(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        """Direct link to a file: ``/files/NAME``."""
        return f"{self.base}/files/{name}"

    def resolve_url(self, name: str) -> str:
        """Hugging Face style link that redirects to :meth:`url`."""
        return f"{self.base}/resolve/main/{name}"

    @property
    def log(self) -> list[LoggedRequest]:
        with self.config.lock:
            return list(self.config.log)

    def clear_log(self) -> None:
        with self.config.lock:
            self.config.log.clear()

    def bytes_sent(self, at_least: int = 0, wait: float = 2.0) -> int:
        """The body bytes written so far; with ``at_least``, waited for up to ``wait`` seconds: the
        handler counts a chunk after its write returns, which can be after the client has read it."""
        end = time.monotonic() + wait
        while (n := sum(r.bytes_sent for r in self.log)) < at_least and time.monotonic() < end:
            time.sleep(0.005)
        return n

    def ranges_asked(self) -> list[tuple[int, int] | None]:
        return [r.range for r in self.log if r.status in (200, 206)]

    def start(self) -> RangeServer:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.config = self.config
        server.stopping = self._stopping
        if self.tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls_cert_file().with_name("both.pem"))
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
            server.scheme = "https"
        self._server = server
        self._port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self.config.stall is not None:
            self.config.stall.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> RangeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
