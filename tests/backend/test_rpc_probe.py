"""The RPC link measured against a real ggml-rpc-server through its protocol, cached per endpoint,
and used by the estimate (a measured link and per-split round trip instead of the defaults)."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers

from offload_planner.backend.rpc_probe import RpcProbeError, probe_link
from offload_planner.backend.speed_store import rpc_link
from offload_planner.core.devices import DeviceSet, build_device_set, parse_device_decl
from offload_planner.core.speed.hardware import Source, hardware_for


@pytest.fixture(autouse=True)
def _own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store of this test's own: the session's may remember a failed probe of a silent server on the
    port a server here is given again (a failure is kept 10 minutes per HOST:PORT)."""
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path / "cfg"))


def test_probe_measures_a_running_rpc_server_and_caches_it(llama_bin_dir: Path, tmp_path: Path) -> None:
    with rpc_servers(llama_bin_dir, 1, tmp_path) as [endpoint]:
        p = probe_link(endpoint)
        assert p.server_version.startswith("7.")
        assert 1 < p.rtt_us < 50_000  # a loopback round trip: tens of microseconds when the machine is idle
        assert p.gbs > 0.001
        assert 0 < p.graph_us < 50_000  # the server's own work on a 30-node graph: tens of µs when idle
        first = rpc_link(endpoint)
    assert first is not None and endpoint in first.note
    # the server is gone: the cached figures are used, nothing is probed
    again = rpc_link(endpoint, measure=False)
    assert again == first
    assert rpc_link("127.0.0.1:1", measure=False) is None


def test_the_estimate_uses_the_measured_link(llama_bin_dir: Path, tmp_path: Path) -> None:
    with rpc_servers(llama_bin_dir, 1, tmp_path) as [endpoint]:
        link = rpc_link(endpoint)
    assert link is not None
    ds = build_device_set(cpu=parse_device_decl("CPU=64GiB"), detected=[], rpc_endpoints=[endpoint],
                          declared=[parse_device_decl("RPC0=16GiB,bw=20GB/s")])
    assert isinstance(ds, DeviceSet)
    rpc = hardware_for(ds, links={endpoint: link})["RPC0"]
    assert rpc.link.source is Source.MEASURED and rpc.link.value == pytest.approx(link.gbs, rel=1e-3)
    assert rpc.latency_us is not None
    assert rpc.latency_us.value == pytest.approx(link.rtt_us + link.graph_us, abs=0.1)
    note = rpc.latency_us.note
    assert "round trip per split" in note and "the server's work on a graph" in note
    declared = build_device_set(cpu=parse_device_decl("CPU=64GiB"), detected=[], rpc_endpoints=[endpoint],
                                declared=[parse_device_decl("RPC0=16GiB,link=1Gb/s")])
    kept = hardware_for(declared, links={endpoint: link})["RPC0"]
    assert kept.link.source is Source.DECLARED and kept.latency_us is None  # a declaration wins


def test_what_is_not_an_rpc_server_is_named() -> None:
    with pytest.raises(RpcProbeError, match=r"127\.0\.0\.1:1: cannot connect"):
        probe_link("127.0.0.1:1")  # nothing listens on port 1
    with pytest.raises(RpcProbeError, match="HOST:PORT"):
        probe_link("no-port")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def close_at_once() -> None:
        conn, _ = srv.accept()
        conn.close()

    t = threading.Thread(target=close_at_once)
    t.start()
    try:
        with pytest.raises(RpcProbeError, match=rf"127\.0\.0\.1:{port}: .*(closed the connection|reset)"):
            probe_link(f"127.0.0.1:{port}")
    finally:
        t.join(5)
        srv.close()


def test_plan_probes_the_rpc_server_it_is_given(llama_bin_dir: Path, tmp_path: Path) -> None:
    """`plan --rpc` measures the link to the running rpc-server and says so in the estimate."""
    from tests.test_cli import QWEN, run

    with rpc_servers(llama_bin_dir, 1, tmp_path) as [endpoint]:
        r = run("plan", QWEN, "--no-detect", "--device", "RPC0=32GiB,bw=20GB/s", "--device", "CPU=64GiB",
                "--json", "--", "--rpc", endpoint, "-c", "4096", "-ngl", "999")
    assert r.returncode in (0, 1), r.stderr
    got = {a["what"]: a for a in json.loads(r.stdout)["speed"]["assumptions"]}
    rtt = got["RPC0 RPC round trip per split"]
    assert rtt["source"] == "measured" and 0 < rtt["value"] < 50_000 and endpoint in rtt["note"]
    assert got["RPC0 host link"]["source"] == "measured"
