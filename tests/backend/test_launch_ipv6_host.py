"""--host ::1: the health URL was http://::1:8080/health (no brackets), which no HTTP client reads; the
server became 'running' only through its log's URL (http://[::1]:8080, arg.cpp's common_http_format_host),
which launch now takes only the port of."""

from __future__ import annotations

import urllib.parse

import pytest

from offload_planner.backend.launch import build_command


@pytest.mark.parametrize(("host", "url"), [
    ("::1", "http://[::1]:8080/health"), ("[::1]", "http://[::1]:8080/health"),
    ("::", "http://127.0.0.1:8080/health"), ("localhost", "http://localhost:8080/health"),
])
def test_the_health_url_of_an_ipv6_host_has_brackets(host: str, url: str) -> None:
    health = build_command("llama-server", ["--host", host], dialect="llama.cpp", port=8080).health_url
    assert health == url
    assert urllib.parse.urlsplit(health).port == 8080
