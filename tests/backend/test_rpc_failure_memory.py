"""A failed RPC probe is remembered per HOST:PORT for ten minutes in the speed store: `plan --rpc`
against a server that does not answer waited the 2 s socket timeout on every run. The estimate says
the failure is remembered and from when; after ten minutes the endpoint is probed again, and a server
that answers by then is measured. A refused connection (learnt at once) is not remembered."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from tests.support.procs import running_process
from tests.support.rpc import wait_listening

from offload_planner.backend import rpc_probe, speed_store
from offload_planner.backend.speed_store import rpc_link
from offload_planner.core.speed.hardware import MeasuredLink


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def _stored(cfg: Path, endpoint: str) -> dict[str, object]:
    data = json.loads((cfg / "speed.json").read_text())
    got: dict[str, object] = data["machines"][speed_store.machine_key()]["rpc_links"][endpoint]
    return got


def _set_failed_at(cfg: Path, endpoint: str, seconds_ago: float) -> None:
    data = json.loads((cfg / "speed.json").read_text())
    entry = data["machines"][speed_store.machine_key()]["rpc_links"][endpoint]
    entry["at"] = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() - seconds_ago))
    (cfg / "speed.json").write_text(json.dumps(data))


def test_a_silent_server_is_remembered_and_measured_after_the_expiry(
        cfg: Path, llama_bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # the kernel accepts the connection; nobody ever answers
    port = silent.getsockname()[1]
    endpoint = f"127.0.0.1:{port}"
    try:
        first = rpc_link(endpoint)
    finally:
        silent.close()
    assert first == f"{endpoint}: no answer within 2 s"
    failed = _stored(cfg, endpoint)
    assert failed["failed"] == first and isinstance(failed["at"], str)

    real_probe = rpc_probe.probe_link

    def no_probe(*a: object, **k: object) -> None:
        raise AssertionError("probed again within ten minutes")

    monkeypatch.setattr(rpc_probe, "probe_link", no_probe)
    again = rpc_link(endpoint)
    assert isinstance(again, str)
    assert again.startswith(f"{endpoint}: no answer within 2 s (a failed probe remembered from "
                            f"{failed['at']}, {cfg / 'speed.json'}; probed again 10 minutes after it)"), again
    assert rpc_link(endpoint, measure=False) is None  # the window never probes: unchanged there
    monkeypatch.setattr(rpc_probe, "probe_link", real_probe)

    # a real rpc-server answers on that port now: still the remembered failure within the ten minutes,
    # measured once they have passed
    with running_process([llama_bin_dir / "ggml-rpc-server", "-H", "127.0.0.1", "-p", str(port)],
                         log_path=tmp_path / "rpc.log"):
        wait_listening(port)
        _set_failed_at(cfg, endpoint, 9 * 60)
        assert isinstance(rpc_link(endpoint), str)
        _set_failed_at(cfg, endpoint, 11 * 60)
        measured = rpc_link(endpoint)
    assert isinstance(measured, MeasuredLink) and measured.gbs > 0 and endpoint in measured.note
    kept = _stored(cfg, endpoint)
    assert "failed" not in kept and kept["gbs"] == round(measured.gbs, 4)


def test_a_refused_connection_is_not_remembered(cfg: Path) -> None:
    """Nothing listens on port 1: the probe fails at once, so the next run probes again (a server
    started meanwhile is measured then), and nothing is written."""
    got = rpc_link("127.0.0.1:1")
    assert isinstance(got, str) and got.startswith("127.0.0.1:1: cannot connect")
    assert not (cfg / "speed.json").exists()


def test_a_hand_edited_failure_is_printed_clean_and_a_future_time_expires(cfg: Path) -> None:
    endpoint = "127.0.0.1:1"
    cfg.mkdir(parents=True)
    now = time.strftime("%Y-%m-%d %H:%M")
    entry = {"rpc_links": {endpoint: {"failed": "bad\x1b[2Jnews\n", "at": now}}}
    (cfg / "speed.json").write_text(json.dumps({"machines": {speed_store.machine_key(): entry}}))
    got = rpc_link(endpoint)
    assert isinstance(got, str) and got.startswith("bad[2Jnews (a failed probe remembered from ")
    entry["rpc_links"][endpoint]["at"] = "2999-01-01 00:00"
    (cfg / "speed.json").write_text(json.dumps({"machines": {speed_store.machine_key(): entry}}))
    got = rpc_link(endpoint)  # not remembered until 2999: probed again (nothing listens: refused)
    assert isinstance(got, str) and got.startswith(f"{endpoint}: cannot connect")


def test_plan_says_the_failure_is_remembered(tmp_path: Path) -> None:
    """`plan --rpc` with a failure remembered for its endpoint: the RPC link's assumption says so and
    when, and that the default link is assumed."""
    from tests.test_cli_hostile4 import QWEN, run

    endpoint = "127.0.0.1:9"
    (tmp_path / "speed.json").write_text(json.dumps({"machines": {speed_store.machine_key(): {"rpc_links": {
        endpoint: {"failed": f"{endpoint}: no answer within 2 s", "at": time.strftime("%Y-%m-%d %H:%M")}}}}}))
    r = run("plan", QWEN, "--no-detect", "--device", "CUDA0=24GiB", "--device", "RPC0=24GiB",
            "--device", "CPU=64GiB,bw=50GB/s", "--", "--rpc", endpoint, "-c", "4096", config=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(x for x in r.stdout.splitlines() if "RPC0 host link" in x)
    assert f"RPC0 {endpoint}: no answer within 2 s (a failed probe remembered from " in line, line
    assert "link assumed 10 GB/s loopback" in line
