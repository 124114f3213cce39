"""An ``--rpc`` entry read the way llama-server reads it, in one place: the parser's refusals, its note
on an ignored tail, the RPC probe, the local-server test, a plan file's device endpoints and the review
of a command's network use all read host and port from here.

``--rpc`` (``common/arg.cpp`` ``add_rpc_devices``) splits its value at every ``,`` and hands each piece
to ggml-rpc as is; ggml-rpc's ``parse_endpoint`` (``ggml/src/ggml-rpc/ggml-rpc.cpp``) splits the entry
at its *first* ``:`` and reads the rest with ``std::stoi`` (leading blanks skipped, anything after the
number ignored: ``127.0.0.1:50052x`` is port 50052), aborting with ``Failed to parse endpoint`` when
there is no ``:`` or no number; ``socket_t::connect`` resolves the host with ``gethostbyname`` (IPv4)
and connects to ``htons(port)``, the port modulo 65536.  Measured with the pinned llama-server
(``--rpc ENTRY --list-devices`` against a ggml-rpc-server on port P): ``127.0.0.1:Px``, ``127.0.0.1:P:5``,
``127.0.0.1: P`` and ``127.0.0.1:P `` list RPC0 from that server; `` 127.0.0.1:P`` and ``127.0.0.1 :P``
abort with ``Failed to connect to`` the entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from offload_planner.core.cmdline.cnum import CNumberError, ignored_tail, stoi


@dataclass(frozen=True)
class RpcEndpoint:
    """One entry as ggml-rpc's ``parse_endpoint`` reads it."""

    host: str  # everything before the first ':'
    port: int  # what std::stoi read after it (llama-server connects to this modulo 65536)
    ignored: str  # what std::stoi left unread after the number


def read_rpc_endpoint(entry: str) -> RpcEndpoint | None:
    """``parse_endpoint``: the entry's host and port, None where ggml-rpc cannot parse it."""
    host, sep, tail = entry.partition(":")
    if not sep:
        return None
    try:
        port = stoi(tail)
    except CNumberError:
        return None
    return RpcEndpoint(host, port, ignored_tail(tail))


def rpc_host(entry: str) -> str:
    """The host llama-server resolves for ``entry``; for an entry it cannot parse, the text before its
    last ``:`` (an IPv6 ``[::1]:50052``, which ggml-rpc refuses), else the whole entry."""
    ep = read_rpc_endpoint(entry)
    if ep is not None:
        return ep.host
    host, _, _ = entry.rpartition(":")
    return host or entry


def rpc_endpoint_problem(endpoint: str) -> tuple[str, str]:
    """(what is wrong, what the pinned llama-server does) for one ``--rpc`` entry; ``("", "")`` when
    its text is a usable HOST:PORT. ggml-rpc's ``parse_endpoint`` splits at the first ``:`` and reads
    the rest with ``std::stoi`` (else it aborts: ``Failed to parse endpoint``); ``socket_t::connect``
    resolves the host and connects to ``htons(port)``, the port modulo 65536 (``:99999`` is port
    34463), and ggml-rpc-server listens on ports 1-65535 only; a host with a blank (``a:1, b:2``'s
    second entry) is not resolved."""
    host, sep, tail = endpoint.partition(":")
    parse_failed = f"llama-server stops: Failed to parse endpoint: {endpoint}"
    if not endpoint:
        return "an empty entry; expected HOST:PORT", parse_failed
    if not sep:
        return "no port; expected HOST:PORT", parse_failed
    try:
        port = stoi(tail)
    except CNumberError as exc:
        return f"port '{tail}': {exc.reason}", parse_failed
    if not host:
        return "no host before ':'; expected HOST:PORT", "llama-server stops: Cannot resolve host ''"
    if host != "".join(host.split()):
        return (f"host {host!r} has a blank; expected HOST:PORT",
                f"llama-server stops: Failed to connect to {endpoint}")
    if not 1 <= port <= 65535:
        return (f"port {port} is outside 1-65535",
                f"llama-server would connect to port {port % 65536}; ggml-rpc-server listens on 1-65535 only")
    return "", ""
