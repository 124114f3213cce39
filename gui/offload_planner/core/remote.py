"""A GGUF file on an http(s) server, read with Range requests (only the bytes the reader asks for).

Hugging Face ``resolve/main/...gguf`` links redirect to a CDN: the redirect is followed with the
Range header kept (only to http/https, never from https down to http while a token is attached),
and a token (``HF_TOKEN``) is sent only over https to the exact origin of huggingface.co, hf.co or
``$HF_ENDPOINT``.  Fetched blocks are cached, so reading the same bytes twice costs one request.  A
server that ignores Range (answers 200 with the whole body) is read as a stream that is closed as
soon as enough is held.  All the time spent on the network by one source is bounded
(:data:`DEFAULT_DEADLINE`): a server that trickles bytes cannot hold the reader.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import IO, cast
from urllib.parse import urlsplit

from offload_planner.core.errors import GGUFError

#: Cache granularity; the reader's first read (1 MiB) is one block.
BLOCK_SIZE = 1 << 20
#: The most one HTTP request asks for; longer reads are split.
MAX_REQUEST_BYTES = 64 << 20
#: The most one source downloads in all: no real GGUF header comes near this.
DEFAULT_MAX_BYTES = 256 << 20
USER_AGENT = "offload-planner/0.1 (GGUF header reader; python-urllib)"

_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)", re.IGNORECASE)
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)", re.IGNORECASE)
_SECRET_HEADERS = frozenset({"authorization", "cookie"})
#: HF_TOKEN goes only over https to these hosts (port 443) and to the origin of $HF_ENDPOINT.
TOKEN_HOSTS: tuple[str, ...] = ("huggingface.co", "hf.co")
#: Seconds one source may spend on the network in all (connecting, waiting, reading).
DEFAULT_DEADLINE = 60.0
_DEFAULT_PORTS = {"http": 80, "https": 443}
_READ_CHUNK = 256 * 1024


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the port made explicit; credentials stay within one origin."""
    try:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:  # malformed: an origin no other URL has
        return "", url, None


def token_origins() -> list[tuple[str, str, int | None]]:
    """The origins HF_TOKEN may be sent to: https only, exact host and port."""
    out: list[tuple[str, str, int | None]] = [("https", h, 443) for h in TOKEN_HOSTS]
    endpoint = os.environ.get("HF_ENDPOINT", "").strip()
    if endpoint and _origin(endpoint)[0] == "https":
        out.append(_origin(endpoint))
    return out


def _is_token_origin(url: str) -> bool:
    return _origin(url) in token_origins()


def _set_timeout(resp: http.client.HTTPResponse, seconds: float) -> None:
    """Bound the next wait on the response's socket (best effort: http.client keeps it private)."""
    sock = getattr(getattr(resp.fp, "raw", None), "_sock", None)
    if isinstance(sock, socket.socket):
        sock.settimeout(seconds)


class _Watchdog:
    """Shuts a connection's socket down when the deadline passes while http.client is still
    connecting or reading the status line and headers (each of its reads has only the socket
    timeout: a server sending a header byte a second would hold it for ever)."""

    def __init__(self) -> None:
        self.until = 0.0  # time.monotonic() at which the current request gives up
        self.fired = False
        self.sock: socket.socket | None = None  # the last connection's (its body is read on it too)
        self._timers: list[threading.Timer] = []

    def arm(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        self.sock = sock
        timer = threading.Timer(max(0.0, self.until - time.monotonic()), self._fire, (sock,))
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _fire(self, sock: socket.socket) -> None:
        self.fired = True
        with contextlib.suppress(OSError):  # already closed: nothing to cut
            sock.shutdown(socket.SHUT_RDWR)

    def disarm(self) -> None:
        for t in self._timers:
            t.cancel()
        self._timers.clear()


def _watched(base: type[http.client.HTTPConnection], watchdog: _Watchdog) -> type[http.client.HTTPConnection]:
    class Watched(base):  # type: ignore[valid-type,misc]
        def connect(self) -> None:
            super().connect()
            watchdog.arm(self.sock)

    return Watched


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._conn = _watched(http.client.HTTPConnection, watchdog)

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._conn, req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self._conn = _watched(http.client.HTTPSConnection, watchdog)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(self._conn, req)  # the default https context: certificates checked


class _RefusedRedirect(Exception):
    """Internal: a redirect the reader does not follow (another scheme, a downgrade)."""


class _Unsatisfiable(Exception):
    """Internal: HTTP 416, with the server's Content-Range (``bytes */TOTAL``)."""

    def __init__(self, content_range: str) -> None:
        self.content_range = content_range


class _RedirectKeepingRange(urllib.request.HTTPRedirectHandler):
    """Follows redirects keeping Range; drops credentials when the target is another origin."""

    def __init__(self, origin: tuple[str, str, int | None]) -> None:
        self._origin = origin

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        scheme = _origin(newurl)[0]
        if scheme not in ("http", "https"):
            fp.close()
            raise _RefusedRedirect(f"redirected to {newurl[:200]}: only http and https are followed")
        has_secret = any(k.lower() in _SECRET_HEADERS for k, _ in req.header_items())
        if has_secret and _origin(req.full_url)[0] == "https" and scheme == "http":
            fp.close()
            raise _RefusedRedirect(f"redirected from https to plain http ({newurl[:200]}) with a token "
                                   "attached: not followed")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(newurl) != self._origin:
            for name in list(new.headers):
                if name.lower() in _SECRET_HEADERS:
                    del new.headers[name]
        return new


class Cancel:
    """A handle to end a task's network reads at once (the window's loader, when its load is replaced
    or the window closes): the sources opened inside :func:`cancel_scope` of it raise GGUFError
    ("cancelled") and their connections are cut, where a silent server held the task, a thread of the
    loader's pool and the window's close, up to the 60 s deadline."""

    def __init__(self) -> None:
        self.cancelled = False
        self._sources: list[HttpRangeSource] = []
        self._lock = threading.Lock()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            sources = list(self._sources)
        for src in sources:
            src.abort()

    def _add(self, src: HttpRangeSource) -> None:
        with self._lock:
            self._sources.append(src)
            cancelled = self.cancelled
        if cancelled:
            src.abort()


_SCOPE = threading.local()


@contextlib.contextmanager
def cancel_scope(cancel: Cancel) -> Iterator[None]:
    """Sources this thread opens within it are ended by ``cancel.cancel()`` (from any thread)."""
    previous = getattr(_SCOPE, "cancel", None)
    _SCOPE.cancel = cancel
    try:
        yield
    finally:
        _SCOPE.cancel = previous


class HttpRangeSource:
    """A :class:`~offload_planner.core.byte_source.ByteSource` over HTTP Range requests.

    ``request_count`` and ``bytes_fetched`` count what went over the network.  ``HF_TOKEN`` is sent
    as a bearer token only over https to huggingface.co, hf.co or ``$HF_ENDPOINT`` (the exact
    origin), and like any ``Authorization`` given in ``headers`` it is dropped when a redirect leads
    to another origin.  ``timeout`` bounds each wait on the socket, ``deadline`` all the time the
    source spends on the network.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30,
        headers: Mapping[str, str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        deadline: float | None = None,
    ) -> None:
        self._url = url
        self._timeout = timeout
        self._deadline = DEFAULT_DEADLINE if deadline is None else deadline
        self._spent = 0.0  # seconds spent on the network so far
        self._max_bytes = max_bytes
        self._headers = self._base_headers(headers)
        self._watchdog = _Watchdog()
        self._opener = urllib.request.build_opener(
            _RedirectKeepingRange(_origin(url)), _WatchedHTTPHandler(self._watchdog),
            _WatchedHTTPSHandler(self._watchdog))
        self._resolved: str | None = None  # where the last redirect chain ended
        self._blocks: dict[int, bytes] = {}
        self._ranged = True  # False once the server ignored Range: read one stream from 0
        self._stream: http.client.HTTPResponse | None = None
        self._stream_pos = 0
        self.request_count = 0
        self.bytes_fetched = 0
        self._cancel: Cancel | None = getattr(_SCOPE, "cancel", None)
        if self._cancel is not None:
            self._cancel._add(self)
        self._size = self._probe()

    # ByteSource -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._url

    @property
    def size(self) -> int:
        return self._size

    @property
    def final_url(self) -> str:
        """The URL the redirects ended at (the original one if there were none)."""
        return self._resolved or self._url

    def read(self, offset: int, n: int) -> bytes:
        if n <= 0 or offset < 0 or offset >= self._size:
            return b""
        end = min(self._size, offset + n)
        first, last = offset // BLOCK_SIZE, (end - 1) // BLOCK_SIZE
        if not self._ranged:
            self._fill_from_stream(last)
        else:
            self._fill_ranges(first, last)
        chunks = [self._blocks[i] for i in range(first, last + 1)]
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        skip = offset - first * BLOCK_SIZE
        return data[skip : skip + (end - offset)]

    def close(self) -> None:
        self._close_stream()
        self._blocks.clear()

    def __enter__(self) -> HttpRangeSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # requests ---------------------------------------------------------------------------------

    def _base_headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        out = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
        token = os.environ.get("HF_TOKEN", "").strip()
        if token and _is_token_origin(self._url):
            if not all("!" <= c <= "~" for c in token):  # http.client's refusal quoted the token
                raise GGUFError(self._url, "HF_TOKEN holds a space, a line break or another character a "
                                           "token has not (two tokens pasted?): set it to the token alone")
            out["Authorization"] = f"Bearer {token}"
        out.update(extra or {})
        return out

    def _sends_token(self) -> bool:
        return any(k.lower() == "authorization" for k in self._headers)

    def _fail(self, message: str) -> GGUFError:
        if self._cancel is not None and self._cancel.cancelled:  # the cut connection's error is no news
            message = "cancelled"
        return GGUFError(self._url, message)

    def abort(self) -> None:
        """Cut the connection now (from any thread): the read under way ends, the next raises."""
        self._watchdog.fired = True
        sock = self._watchdog.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _remaining(self) -> float:
        if self._cancel is not None and self._cancel.cancelled:
            raise self._fail("cancelled")
        left = self._deadline - self._spent
        if left <= 0:
            raise self._fail(f"gave up after {self._deadline:g} s on the network: the server is too slow "
                             "(or sends its answer a few bytes at a time)")
        return left

    def _timed(self, started: float) -> None:
        self._spent += time.monotonic() - started

    def _open(self, start: int, end: int) -> http.client.HTTPResponse:
        """GET ``Range: bytes=start-(end-1)``, from the resolved URL first if there is one."""
        if self._resolved is not None:
            try:
                return self._open_url(self._resolved, start, end)
            except GGUFError:
                self._resolved = None  # e.g. an expired signed CDN link: resolve again
        return self._open_url(self._url, start, end)

    def _open_url(self, url: str, start: int, end: int) -> http.client.HTTPResponse:
        headers = dict(self._headers)
        if _origin(url) != _origin(self._url):
            headers = {k: v for k, v in headers.items() if k.lower() not in _SECRET_HEADERS}
        headers["Range"] = f"bytes={start}-{end - 1}"
        self.request_count += 1
        timeout = min(self._timeout, self._remaining())
        started = time.monotonic()
        self._watchdog.until = started + self._deadline - self._spent
        try:
            req = urllib.request.Request(url, headers=headers, method="GET")
            resp = cast(http.client.HTTPResponse, self._opener.open(req, timeout=timeout))
        except urllib.error.HTTPError as e:
            with e:
                if e.code == 416:
                    raise _Unsatisfiable(e.headers.get("Content-Range", "")) from None
                raise self._fail(self._http_error_message(e.code, e.reason)) from None
        except _RefusedRedirect as e:
            raise self._fail(str(e)) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
            if self._watchdog.fired:
                timeout = 0.0  # the deadline cut the connection
            raise self._fail(self._network_error_message(e, timeout)) from None
        finally:
            self._watchdog.disarm()
            fired, self._watchdog.fired = self._watchdog.fired, False
            self._timed(started)
        if fired:  # the headers ended because the deadline cut the connection
            resp.close()
            raise self._fail(self._network_error_message(TimeoutError(), 0.0))
        final = resp.geturl()
        if final != url:
            self._resolved = final
        return resp

    def _http_error_message(self, code: int, reason: object) -> str:
        if code in (401, 403):
            if self._sends_token():
                return (
                    f"access denied (HTTP {code}) although a token was sent: gated model, "
                    "request access on its page and check HF_TOKEN"
                )
            if os.environ.get("HF_TOKEN", "").strip():
                return (
                    f"access denied (HTTP {code}); HF_TOKEN is sent only over https to Hugging Face hosts "
                    "(or the origin of $HF_ENDPOINT)"
                )
            return f"access denied (HTTP {code}): gated model: set HF_TOKEN"
        if code == 404:
            return "not found (HTTP 404)"
        if 300 <= code < 400:  # urllib's words were three lines
            return f"redirected in a loop or more than 10 times (the last: HTTP {code})"
        said = " ".join(str(reason).split())  # the server's reason phrase: up to 64 KB, any characters
        return f"HTTP {code} {said if len(said) <= 200 else said[:199] + '…'}".rstrip()

    def _network_error_message(self, e: BaseException, timeout: float | None = None) -> str:
        reason: object = e.reason if isinstance(e, urllib.error.URLError) else e
        if isinstance(reason, TimeoutError):
            waited = self._timeout if timeout is None else timeout
            if waited < self._timeout:
                return f"gave up after {self._deadline:g} s on the network: the server answers too slowly"
            return f"timed out after {waited:g} s"
        if timeout == 0.0:
            return f"gave up after {self._deadline:g} s on the network: the server answers too slowly"
        if isinstance(reason, ConnectionRefusedError):
            return "cannot connect: connection refused"
        if isinstance(reason, OSError) and reason.strerror:
            return f"cannot connect: {reason.strerror}"
        return f"cannot read: {reason or type(e).__name__}"

    def _read_body(self, resp: http.client.HTTPResponse, n: int) -> bytes:
        """Up to ``n`` bytes of the body, in chunks, within the deadline."""
        chunks: list[bytes] = []
        got = 0
        while got < n:
            wait = min(self._timeout, self._remaining())
            _set_timeout(resp, wait)
            started = time.monotonic()
            try:
                chunk = resp.read1(min(_READ_CHUNK, n - got))
            except (OSError, http.client.HTTPException, ValueError) as e:
                raise self._fail(self._network_error_message(e, wait)) from None
            finally:
                self._timed(started)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        self.bytes_fetched += got
        return b"".join(chunks)

    # size -------------------------------------------------------------------------------------

    def _probe(self) -> int:
        """First request: the first block, and the total size from Content-Range/Length."""
        try:
            resp = self._open(0, BLOCK_SIZE)
        except _Unsatisfiable as e:
            return self._unsatisfiable_size(e.content_range)
        if resp.status == 206:
            with resp:
                total = self._content_range(resp, 0)[2]
                if total is None:
                    raise self._fail("server does not say the file size (Content-Range */*)")
                self._store_range(resp, 0, min(total, BLOCK_SIZE))
            return total
        if resp.status == 200:
            return self._start_stream(resp)
        resp.close()
        raise self._fail(f"unexpected HTTP {resp.status} to a Range request")

    def _unsatisfiable_size(self, content_range: str) -> int:
        m = _UNSATISFIED_RANGE.fullmatch(content_range.strip())
        if m is None or int(m[1]) != 0:
            raise self._fail("server refused the Range request (HTTP 416)")
        return 0  # an empty file: nothing to read

    def _content_range(
        self, resp: http.client.HTTPResponse, start: int
    ) -> tuple[int, int, int | None]:
        value = resp.headers.get("Content-Range", "").strip()
        m = _CONTENT_RANGE.fullmatch(value)
        if m is None:
            raise self._fail(f"HTTP 206 with a bad Content-Range {value!r}")
        first, last = int(m[1]), int(m[2])
        total = None if m[3] == "*" else int(m[3])
        if first != start or last < first or (total is not None and last >= total):
            raise self._fail(f"asked for bytes from {start}, server sent {value!r}")
        return first, last, total

    def _start_stream(self, resp: http.client.HTTPResponse) -> int:
        """The server ignored Range and sends the whole file: keep the stream, read as needed."""
        length = resp.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            resp.close()
            raise self._fail(
                "server does not support Range requests and sends no Content-Length; "
                "cannot read only the header"
            )
        self._ranged = False
        self._stream = resp
        size = int(length)
        self._size = size
        if size:
            self._fill_from_stream(0)
        return size

    # fetching ---------------------------------------------------------------------------------

    def _check_budget(self, more: int) -> None:
        if self.bytes_fetched + more > self._max_bytes:
            raise self._fail(
                f"reading {more} more bytes would download more than {self._max_bytes} bytes "
                "of header; the header is corrupt or the file is not a GGUF model"
            )

    def _fill_ranges(self, first: int, last: int) -> None:
        """Fetch the missing blocks in ``first..last``, contiguous runs in bounded requests."""
        i = first
        while i <= last:
            if i in self._blocks:
                i += 1
                continue
            j = i
            per_request = MAX_REQUEST_BYTES // BLOCK_SIZE
            while j + 1 <= last and j + 1 - i < per_request and j + 1 not in self._blocks:
                j += 1
            self._fetch_blocks(i, j)
            i = j + 1

    def _fetch_blocks(self, first: int, last: int) -> None:
        start = first * BLOCK_SIZE
        end = min(self._size, (last + 1) * BLOCK_SIZE)
        self._check_budget(end - start)
        try:
            resp = self._open(start, end)
        except _Unsatisfiable:
            raise self._fail(f"server refused bytes {start}-{end - 1} (HTTP 416)") from None
        if resp.status == 200:  # Range no longer honoured: read from the start as a stream
            self._ranged, self._stream, self._stream_pos = False, resp, 0
            self._fill_from_stream(last)
            return
        with resp:
            if resp.status != 206:
                raise self._fail(f"unexpected HTTP {resp.status} to a Range request")
            self._content_range(resp, start)
            self._store_range(resp, start, end)

    def _store_range(self, resp: http.client.HTTPResponse, start: int, end: int) -> None:
        data = self._read_body(resp, end - start)
        if len(data) != end - start:
            raise self._fail(
                f"server sent {len(data)} bytes for bytes {start}-{end - 1} "
                f"(expected {end - start})"
            )
        for pos in range(start, end, BLOCK_SIZE):
            self._blocks[pos // BLOCK_SIZE] = data[pos - start : pos - start + BLOCK_SIZE]

    def _fill_from_stream(self, last: int) -> None:
        """Read the whole-body stream on until block ``last`` is held (then stop: no more)."""
        end = min(self._size, (last + 1) * BLOCK_SIZE)
        if self._stream_pos >= end:
            return
        if self._stream is None:
            raise self._fail("the server closed the download before the header was read")
        self._check_budget(end - self._stream_pos)
        while self._stream_pos < end:
            want = min(BLOCK_SIZE, self._size - self._stream_pos)
            data = self._read_body(self._stream, want)
            if len(data) != want:
                self._close_stream()
                raise self._fail(
                    f"the download ended at byte {self._stream_pos + len(data)} of {self._size}"
                )
            self._blocks[self._stream_pos // BLOCK_SIZE] = data
            self._stream_pos += want
        if self._stream_pos >= self._size:
            self._close_stream()

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
