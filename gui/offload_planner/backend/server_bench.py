"""Measure a running llama-server's prompt and generation speed through its HTTP API.

One fixed request (:data:`DEFAULT_PROMPT_TOKENS` prompt tokens given as token ids, so no tokenizer
or chat template is involved, then :data:`DEFAULT_GEN_TOKENS` generated tokens with ``ignore_eos``
and the prompt cache off) is sent to ``/completion``; the server's own ``timings`` object gives
the prompt and generation rates (``prompt_per_second``, ``predicted_per_second``), so HTTP and
JSON overhead is not counted.  A short warm-up request first pages the weights in and builds the
graphs.  Pure Python (urllib); no Qt.
"""

from __future__ import annotations

import contextlib
import csv
import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from offload_planner.core.errors import PlannerError
from offload_planner.core.printable import printable

DEFAULT_PROMPT_TOKENS = 512
DEFAULT_GEN_TOKENS = 64
FIRST_TOKEN_ID = 100  # clear of the control tokens a vocabulary keeps at its start


@dataclass(frozen=True, slots=True)
class MeasuredSpeed:
    """What the server reported for one request."""

    prompt_tokens: int
    prompt_ms: float
    pp_tps: float
    gen_tokens: int
    gen_ms: float
    tg_tps: float

    def as_dict(self) -> dict[str, float | int]:
        return {
            "prompt_tokens": self.prompt_tokens, "prompt_ms": round(self.prompt_ms, 3),
            "pp_tps": round(self.pp_tps, 3), "gen_tokens": self.gen_tokens,
            "gen_ms": round(self.gen_ms, 3), "tg_tps": round(self.tg_tps, 3),
        }


#: the fastest rate taken as measured (tokens/s): far above any server's prompt processing
MAX_RATE = 1e7


class BenchError(PlannerError):
    """The server did not answer the benchmark request as llama-server does."""


def prompt_ids(n: int, n_vocab: int) -> list[int]:
    """``n`` fixed token ids, cycling through the vocabulary after its first ids."""
    span = max(1, n_vocab - 2 * FIRST_TOKEN_ID)
    return [FIRST_TOKEN_ID + (i * 7919) % span for i in range(n)]


#: The most bytes read of an answer (a llama-server's is a few kB): a larger one is not JSON we read
MAX_ANSWER_BYTES = 16 << 20


def _read_all(resp: Any, url: str, deadline: float, cut: threading.Event) -> bytes:
    """The answer's body by pieces, at most :data:`MAX_ANSWER_BYTES`, by ``deadline`` (or one socket
    timeout after it): the socket's timeout is per read, so a server sending a byte a second kept the
    check waiting for days."""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_ANSWER_BYTES:
        left = deadline - time.monotonic()
        if left <= 0 or cut.is_set():
            raise BenchError(f"{url}: the answer did not arrive in time (still coming after {size:,} bytes)")
        piece = resp.read1(1 << 16)
        if not piece:
            break
        chunks.append(piece)
        size += len(piece)
    if size > MAX_ANSWER_BYTES:
        raise BenchError(f"{url}: the answer is more than {MAX_ANSWER_BYTES:,} bytes (not llama-server's)")
    if cut.is_set():
        raise BenchError(f"{url}: the answer did not arrive in time (still coming after {size:,} bytes)")
    if resp.length:  # the connection closed before the Content-Length it announced
        raise BenchError(f"{url}: no answer to the benchmark request (the connection closed after {size:,} "
                         f"bytes, {resp.length:,} short of the answer's length)")
    return b"".join(chunks)


def _address(url: str) -> urllib.parse.SplitResult:
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # a ValueError for a port that is no number
    except ValueError as e:  # the address the server's log gave is none
        raise BenchError(f"{url}: not an address to send the benchmark request to ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchError(f"{url}: not an address to send the benchmark request to (no http:// host)")
    return parts


def _connection(parts: urllib.parse.SplitResult, timeout: float) -> http.client.HTTPConnection:
    """No proxy and no redirect: the server is the one we started (the https default context checks
    its certificate, as urllib did)."""
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname or "", parts.port, timeout=timeout)


def _cutter(conn: http.client.HTTPConnection, seconds: float, cut: threading.Event) -> threading.Timer:
    """Shut the connection down after ``seconds``: http.client reads the status line and headers with
    only the socket's per-read timeout, so a server trickling them in held the check for ever."""
    def fire() -> None:
        cut.set()
        sock = conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(max(0.0, seconds), fire)
    timer.daemon = True
    timer.start()
    return timer


def _post(url: str, body: dict[str, Any], timeout: float, api_key: str | None = None) -> dict[str, Any]:
    data = json.dumps(body).encode()
    deadline = time.monotonic() + timeout
    parts = _address(url)
    headers = {"Content-Type": "application/json"}
    if api_key:  # llama-server started with --api-key answers 401 to a request without it
        headers["Authorization"] = f"Bearer {api_key}"
    cut = threading.Event()
    conn = _connection(parts, timeout)
    timer = _cutter(conn, timeout, cut)
    try:
        conn.request("POST", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), body=data,
                     headers=headers)
        resp = conn.getresponse()
        if resp.status >= 400:
            raise BenchError(_refusal(url, resp.status, resp.read(1 << 16), body, bool(api_key)))
        payload = _read_all(resp, url, deadline, cut)
    except (http.client.HTTPException, OSError, ValueError) as e:
        if cut.is_set():
            raise BenchError(f"{url}: the answer did not arrive in time ({timeout:g} s)") from None
        if isinstance(e, http.client.HTTPException) and not isinstance(e, ConnectionError):
            raise BenchError(f"{url}: not an HTTP answer ({type(e).__name__}: "
                             f"{printable(str(e))[:200]})") from None
        raise BenchError(f"{url}: no answer to the benchmark request ({printable(str(e))[:300]})") from None
    finally:
        timer.cancel()
        conn.close()
    try:
        out = json.loads(payload)
    except (ValueError, RecursionError):  # RecursionError: nested too deeply
        raise BenchError(f"{url}: the answer is not JSON") from None
    if not isinstance(out, dict):
        raise BenchError(f"{url}: the answer is not a JSON object")
    return out


def _refusal(url: str, code: int, raw: bytes, body: dict[str, Any], sent_key: bool = False) -> str:
    """A request llama-server answered with an error status, in its own words and with what to do:
    "HTTP Error 400: Bad Request" alone left a context too small for the bench's request (-c 512:
    "request (512 tokens) exceeds the available context size") without a word of why."""
    said = ""
    try:
        err = json.loads(raw).get("error", {})
        said = printable(str(err.get("message", "")))[:300] if isinstance(err, dict) else ""
        kind = err.get("type", "") if isinstance(err, dict) else ""
    except (OSError, ValueError, AttributeError, RecursionError):
        kind = ""
    text = f"{url}: llama-server refused the benchmark request (HTTP {code}{': ' + said if said else ''})"
    if kind == "exceed_context_size_error":
        need = len(body.get("prompt", [])) + int(body.get("n_predict", 0))
        text += (f"; its {len(body.get('prompt', []))}-token prompt and {body.get('n_predict')} generated "
                 f"tokens need a context of {need} tokens a slot: raise -c (it is shared by the -np slots)")
    elif kind == "authentication_error" and code == 401:
        text += ("; the command's --api-key (or --api-key-file) was not accepted" if sent_key else
                 "; it wants an API key, and neither the command nor LLAMA_API_KEY gives one")
    return text


def _timings(url: str, answer: dict[str, Any]) -> MeasuredSpeed:
    t = answer.get("timings")
    if not isinstance(t, dict):
        raise BenchError(f"{url}: the answer has no 'timings' object (not a llama-server?)")
    try:
        got = MeasuredSpeed(
            prompt_tokens=int(t["prompt_n"]), prompt_ms=float(t["prompt_ms"]),
            pp_tps=float(t["prompt_per_second"]), gen_tokens=int(t["predicted_n"]),
            gen_ms=float(t["predicted_ms"]), tg_tps=float(t["predicted_per_second"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise BenchError(f"{url}: 'timings' lacks {e}") from None
    except OverflowError:  # Infinity as a count of tokens
        raise BenchError(f"{url}: 'timings' gives an infinite count of tokens") from None
    # a rate of 0 (a cached prompt, a proxy) divided the calibration by zero; nan/inf/negative ones
    # were printed as measurements and compared with the estimate
    for key, v in (("prompt_ms", got.prompt_ms), ("prompt_per_second", got.pp_tps),
                   ("predicted_ms", got.gen_ms), ("predicted_per_second", got.tg_tps)):
        if not 0 < v < math.inf:
            raise BenchError(f"{url}: 'timings' gives {key} = {t[key]!r}, not a measured time or rate")
    # llama-server reports each rate as about its tokens over its time (tg: one token fewer, the first
    # is the prompt's): one far from it (1e300 t/s in 1e-300 ms, printed as a 300-digit measurement)
    # is not a measurement
    for key, n, ms, rate in (("prompt_per_second", got.prompt_tokens, got.prompt_ms, got.pp_tps),
                             ("predicted_per_second", got.gen_tokens, got.gen_ms, got.tg_tps)):
        if not (rate <= MAX_RATE and n * 400.0 / ms <= rate <= n * 2500.0 / ms):
            raise BenchError(f"{url}: 'timings' gives {key} = {t[key]!r} for {n} tokens in {ms:g} ms, "
                             "not a measured rate")
    return got


#: The most of an --api-key-file read for its first key
KEY_FILE_BYTES = 64 << 10


def api_key_of(parsed: Any) -> str | None:
    """The key a request to the server launched with ``parsed`` (a ``ParsedArgs``, the environment's
    ``LLAMA_API_KEY`` included) must carry, read as arg.cpp reads it: the first non-empty field of
    ``--api-key``'s comma-separated list (CSV quotes allowed), else the first line of ``--api-key-file``
    that is not empty and does not start with ``#`` (None: no key)."""
    flags = list(getattr(parsed, "flags", None) or [])
    for f in flags:
        if f.key == "--api-key" and f.values:
            first = next((k for k in next(csv.reader([f.values[0]]), []) if k), None)
            if first:
                return first
    for f in flags:
        if f.key == "--api-key-file" and f.values:
            try:
                with open(f.values[0], "rb") as fh:
                    text = fh.read(KEY_FILE_BYTES).decode("utf-8", "replace")
            except OSError:
                return None
            return next((ln for ln in text.split("\n") if ln and not ln.startswith("#")), None)
    return None


def request_body(prompt: list[int], n_predict: int) -> dict[str, Any]:
    return {
        "prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "cache_prompt": False,
        "temperature": 0.0, "stream": False,
    }


def measure(base_url: str, *, n_vocab: int, prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
            gen_tokens: int = DEFAULT_GEN_TOKENS, warmup: bool = True,
            timeout: float = 600.0, api_key: str | None = None) -> MeasuredSpeed:
    """Send the fixed benchmark request to ``base_url`` (``http://127.0.0.1:PORT``); ``api_key``: the
    server's ``--api-key`` (sent as a bearer token)."""
    url = base_url.rstrip("/") + "/completion"
    if warmup:
        _post(url, request_body(prompt_ids(min(32, prompt_tokens), n_vocab), 4), timeout, api_key)
    answer = _post(url, request_body(prompt_ids(prompt_tokens, n_vocab), gen_tokens), timeout, api_key)
    got = _timings(url, answer)
    if got.prompt_tokens > 2 * prompt_tokens + 16 or got.gen_tokens > 2 * gen_tokens + 16:
        # the estimate walks the reported prompt micro-batch by micro-batch: 10^15 tokens hung it
        raise BenchError(f"{url}: the server reports {got.prompt_tokens} prompt and {got.gen_tokens} "
                         f"generated tokens for a request of {prompt_tokens} and {gen_tokens} (not "
                         "llama-server's answer)")
    if got.prompt_tokens < prompt_tokens - 1 or got.gen_tokens < gen_tokens:
        raise BenchError(
            f"{url}: the server processed {got.prompt_tokens} prompt and {got.gen_tokens} generated "
            f"tokens, not {prompt_tokens} and {gen_tokens} (context too small?)"
        )
    return got
