"""An rpc-server on this machine computing with ggml's CPU backend is given this machine's CPU figures.

The evidence, from real ggml-rpc-servers of the pinned build: the probe asks GET_DEVICE_MEMORY of the
server's device 0 (ggml_backend_dev_memory: a CPU backend's total is sysconf(_SC_PHYS_PAGES) x
sysconf(_SC_PAGE_SIZE)) and DEVICE_COUNT; a loopback endpoint serving one device whose total is this
machine's RAM to the byte is this machine's CPU backend.  Remote endpoints and other totals keep the
figures they had.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers

from offload_planner.backend.rpc_probe import probe_link
from offload_planner.backend.speed_store import (
    cpu_backend_evidence,
    devices_hardware,
    machine_key,
    ram_total,
    rpc_link,
    this_cpu,
    thread_use,
)
from offload_planner.core.devices import DeviceSet, build_device_set, parse_device_decl
from offload_planner.core.speed.hardware import MeasuredLink, Source, hardware_for, host_speed

RAM_GBS, THREAD_GBS = 31.8, 20.6


@pytest.fixture(autouse=True)
def _own_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store of this test's own holding a quiet RAM probe (no probe runs): the figure every device
    reading this machine's RAM must show."""
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    (cfg / "speed.json").write_text(json.dumps({"machines": {machine_key(): {
        "ram_gbs": RAM_GBS, "ram_measured_at": "2026-11-28 12:31", "ram_busy": False,
        "ram_thread_gbs": THREAD_GBS, "ram_thread_measured_at": "2026-11-28 12:31",
        "ram_thread_busy": False}}}))
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(cfg))


def _devices(endpoints: list[str], *decls: str) -> DeviceSet:
    ds = build_device_set(cpu=parse_device_decl("CPU=64GiB"), detected=[], rpc_endpoints=endpoints,
                          declared=[parse_device_decl(d) for d in decls])
    assert isinstance(ds, DeviceSet)
    return ds


def test_a_cpu_rpc_server_reports_this_machines_ram(llama_bin_dir: Path, tmp_path: Path) -> None:
    """What the evidence rests on: the pinned rpc-server (no accelerator here) serves one device, whose
    total memory is this machine's RAM as ggml's CPU backend computes it."""
    ram = ram_total()
    assert ram is not None and ram == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with rpc_servers(llama_bin_dir, 1, tmp_path) as [endpoint]:
        p = probe_link(endpoint)
    assert p.n_devices == 1 and p.mem_total == ram


def test_local_rpc_servers_get_this_machines_cpu_figures(llama_bin_dir: Path, tmp_path: Path) -> None:
    """Two rpc-servers without declared figures: each reads the RAM the CPU's probe measured (the same
    figure and source as the CPU's) and computes with its server's threads x this machine's core (the
    CPU's compute per thread at -t 2), with ggml-cpu's efficiencies; the assumptions say why."""
    with rpc_servers(llama_bin_dir, 2, tmp_path) as endpoints:
        ds = _devices(endpoints)
        hw = devices_hardware(ds, 2, probe_rpc=True)
    cpu = hw["CPU"]
    per_core = cpu.tflops.value / 2
    assert per_core == pytest.approx(host_speed(ds.cpu, threads=1, cpu=this_cpu()).tflops.value, rel=1e-3)
    threads = thread_use(ds, 2)
    assert threads is not None
    for name, ep in zip(("RPC0", "RPC1"), endpoints, strict=True):
        rpc = hw[name]
        assert rpc.cpu_backend
        assert rpc.bandwidth.value == cpu.bandwidth.value == RAM_GBS
        assert rpc.bandwidth.source is cpu.bandwidth.source is Source.MEASURED
        assert "RAM probe on this machine" in rpc.bandwidth.note
        assert "this machine's CPU backend" in rpc.bandwidth.note and ep in rpc.bandwidth.note
        n = threads.rpc[ep]
        assert n == max(1, (os.cpu_count() or 2) // 2)  # rpc-server.cpp's default
        assert rpc.threads == n
        assert rpc.tflops.value == pytest.approx(n * per_core, rel=1e-3)
        assert rpc.isa_gain == cpu.isa_gain and rpc.isa == cpu.isa
        assert rpc.thread_bandwidth is not None and rpc.thread_bandwidth.value == THREAD_GBS
        assert rpc.link.source is Source.MEASURED  # the link as measured before


def test_declared_figures_win_and_threads_are_the_servers(llama_bin_dir: Path, tmp_path: Path) -> None:
    with rpc_servers(llama_bin_dir, 2, tmp_path) as endpoints:
        ds = _devices(endpoints, "RPC0=16GiB,bw=20GB/s,threads=3", "RPC1=16GiB,tflops=7")
        hw = devices_hardware(ds, 2, probe_rpc=True)
    per_core = hw["CPU"].tflops.value / 2
    r0, r1 = hw["RPC0"], hw["RPC1"]
    assert r0.bandwidth.value == 20 and r0.bandwidth.source is Source.DECLARED
    assert r0.threads == 3 and r0.tflops.value == pytest.approx(3 * per_core, rel=1e-3)
    assert r1.tflops.value == 7 and r1.tflops.source is Source.DECLARED
    assert r1.bandwidth.value == RAM_GBS and r1.bandwidth.source is Source.MEASURED


def test_other_endpoints_and_other_memory_keep_todays_figures() -> None:
    """No evidence, no change: a remote endpoint reporting this machine's RAM (another machine of the
    same size), a local one reporting another total (a GPU) or several devices, a link kept before the
    memory was asked."""
    ram = ram_total()
    assert ram is not None
    ep_remote, ep_local = "10.0.0.5:50052", "127.0.0.1:50052"
    for ep, total, n in ((ep_remote, ram, 1), (ep_local, ram - 4096, 1), (ep_local, ram, 2),
                         (ep_local, None, None)):
        ds = _devices([ep])
        links: dict[str, MeasuredLink | str] = {ep: MeasuredLink(2.0, 30.0, "test", 20.0, total, n)}
        evidence = cpu_backend_evidence(ds, links)
        assert evidence == {}
        assert hardware_for(ds, links=links, cpu_rpc=evidence) == hardware_for(ds, links=links)
        assert hardware_for(ds, links=links)["RPC0"].bandwidth.source is Source.DEFAULT
    ds = _devices([ep_local])
    links = {ep_local: MeasuredLink(2.0, 30.0, "test", 20.0, ram, 1)}
    assert set(cpu_backend_evidence(ds, links)) == {"RPC0"}


def test_a_link_kept_before_the_memory_was_asked_is_asked_once(llama_bin_dir: Path, tmp_path: Path) -> None:
    """A cached link without the memory: not probed without ``measure`` (no evidence), probed again
    with it (the server's memory kept), its figures kept when the server is gone."""
    cfg = Path(os.environ["OFFLOAD_PLANNER_CONFIG_DIR"]) / "speed.json"
    with rpc_servers(llama_bin_dir, 1, tmp_path) as [endpoint]:
        data = json.loads(cfg.read_text())
        data["machines"][machine_key()]["rpc_links"] = {endpoint: {
            "gbs": 1.5, "rtt_us": 40.0, "graph_us": 20.0, "at": "2026-11-28 12:00", "server": "7.0.0"}}
        cfg.write_text(json.dumps(data))
        old = rpc_link(endpoint, measure=False)
        assert isinstance(old, MeasuredLink) and old.mem_total is None and old.gbs == 1.5
        new = rpc_link(endpoint)
        assert isinstance(new, MeasuredLink) and new.mem_total == ram_total() and new.n_devices == 1
    kept = json.loads(cfg.read_text())["machines"][machine_key()]["rpc_links"][endpoint]
    assert kept["mem_total"] == ram_total()
    # a server gone: an old-format entry keeps its figures rather than a failure
    data = json.loads(cfg.read_text())
    data["machines"][machine_key()]["rpc_links"]["127.0.0.1:1"] = {"gbs": 1.5, "rtt_us": 40.0}
    cfg.write_text(json.dumps(data))
    gone = rpc_link("127.0.0.1:1")
    assert isinstance(gone, MeasuredLink) and gone.gbs == 1.5 and gone.mem_total is None


def test_plan_says_where_the_rpc_figures_come_from(llama_bin_dir: Path, tmp_path: Path) -> None:
    """`plan --rpc` on a local rpc-server without declared figures: its bandwidth is the RAM probe's, its
    compute efficiency the CPU's, and the assumptions name the evidence."""
    from tests.test_cli import QWEN, run

    with rpc_servers(llama_bin_dir, 1, tmp_path) as [endpoint]:
        r = run("plan", QWEN, "--no-detect", "--device", "CPU=64GiB", "--json", "--", "--rpc", endpoint,
                "-c", "4096", "-ngl", "999", "-t", "2")
    assert r.returncode in (0, 1), r.stderr
    got = {a["what"]: a for a in json.loads(r.stdout)["speed"]["assumptions"]}
    bw = got["RPC0 memory bandwidth"]
    assert bw["source"] == "measured" and bw["value"] == RAM_GBS
    gib = (ram_total() or 0) / 2**30
    assert f"RPC0: this machine's CPU backend (its memory {gib:.1f} GiB = this machine's RAM" in bw["note"]
    eff, cpu_eff = got["RPC0 compute efficiency"], got["CPU compute efficiency"]
    assert (eff["value"], eff["note"]) == (cpu_eff["value"], cpu_eff["note"])
    n = max(1, (os.cpu_count() or 2) // 2)
    assert got["RPC0 compute"]["value"] == pytest.approx(got["CPU compute"]["value"] / 2 * n, rel=1e-3)


def test_launch_bench_probes_a_local_rpc_server_before_llama_server_holds_it(
        llama_bin_dir: Path, tmp_path: Path) -> None:
    """A first `launch --bench` on a local rpc-server (nothing cached: the user who read pp 87x too fast):
    the server is probed before llama-server connects, so the bench's estimate has the evidence; the
    link and the memory it reported are kept."""
    from tests.support.cli import run_cli

    from offload_planner.core.synth import SMALL_MODELS, write_model

    model = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "qwen3moe.gguf")[0]
    cfg = Path(os.environ["OFFLOAD_PLANNER_CONFIG_DIR"]) / "speed.json"
    with rpc_servers(llama_bin_dir, 1, tmp_path) as (endpoint,):
        r = run_cli("launch", str(model), "--no-detect", "--server", str(llama_bin_dir / "llama-server"),
                    "--quiet", "--bench", "--no-store", "--bench-prompt", "64", "--bench-gen", "8", "--",
                    "--rpc", endpoint, "-ngl", "999", "-c", "512", "-np", "1", "-fit", "off", timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert any(ln.strip().startswith("pp ") and "estimated" in ln for ln in r.stdout.splitlines()), r.stdout
    kept = json.loads(cfg.read_text())["machines"][machine_key()]["rpc_links"][endpoint]
    assert kept["mem_total"] == ram_total() and kept["devices"] == 1
