"""A fitted command loads in the real llama-server on RPC devices of the declared sizes.

Two local ggml-rpc-servers are the GPUs (RPC0, RPC1); each is declared smaller than the model needs:
what the command puts there with every routed expert on the CPU, plus its margin, plus room for
60% of its experts (one of its two expert layers).  ``core.speed.fastest`` picks the placement (the
loopback links are declared fast, so that moving experts onto the RPC devices pays on this tiny
model), and the real
llama-server runs the command it prints: it must load the model and listen, with the buffers it
logs on each RPC device within that device's declared size minus its margin, and with routed
experts on both the RPC devices and the CPU.  Allowed to quantize the KV cache, the search picks
q8_0 for K and V, and that command loads as well.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import server_output

from offload_planner.backend.log_parser import parse_log
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_command, plan_from_args
from offload_planner.core.speed.efficiency import calibrated
from offload_planner.core.speed.fastest import fastest_plan
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.units import MiB

pytestmark = pytest.mark.integration
FAST_LOOPBACK = ("link", "100GB/s"), ("bw", "500GB/s")


@pytest.mark.parametrize(("goal", "kv_quant"), [("tg", False), ("balanced", False), ("tg", True)])
def test_fitted_command_loads_within_the_declared_sizes(
    goal: str, kv_quant: bool, small_models: dict[str, Path], llama_server: Path, llama_bin_dir: Path,
    tmp_path: Path,
) -> None:
    path = small_models["qwen3moe"]
    model = open_model(path)
    margin = 1 * MiB
    with rpc_servers(llama_bin_dir, 2, tmp_path) as eps:
        big = tuple(Device(f"RPC{i}", DeviceKind.RPC, 1 << 30, None, source="declared", endpoint=ep,
                           margin=margin, hardware=FAST_LOOPBACK) for i, ep in enumerate(eps))
        cpu = Device("CPU", DeviceKind.CPU, 64 << 30, None, hardware=(("bw", "20GB/s"),))
        base = ["--rpc", ",".join(eps), "-c", "2048", "-np", "1"]
        experts_off = plan_from_args(model, DeviceSet(cpu, big), parse_server_args([*base, "--cpu-moe"]))
        without = experts_off.projection()
        experts = experts_off.placement()
        share = {g.name: sum(p.tensor.nbytes for p in plan_from_args(
            model, DeviceSet(cpu, big), parse_server_args(base)).placement().items
            if p.device == g.name and p.tensor.role.is_routed_expert) for g in big}
        assert experts and all(share.values())
        gpus = tuple(replace(g, total=without.device(g.name).resident() + margin + share[g.name] * 6 // 10)
                     for g in big)
        devices = DeviceSet(cpu, gpus)
        eff = calibrated({"rpc_latency_us": 1.0}, "test: loopback")
        r = fastest_plan(model, devices, base, hardware_for(devices), goal=goal, prompt=512, eff=eff,
                         allow_kv_quant=kv_quant)
        assert r.best is not None, r.notes
        kv = (r.best.plan.context.type_k, r.best.plan.context.type_v)
        assert kv == (("q8_0", "q8_0") if kv_quant else ("f16", "f16"))  # the halved cache makes room
        assert r.best.label.startswith("fastest"), [(c.label, c.fits) for c in r.candidates]
        where = r.best.plan.placement().tensor_devices()
        exps = {d for n, d in where.items() if "_exps" in n}
        assert {"CPU", "RPC0", "RPC1"} <= exps, exps
        output = server_output(llama_server, plan_command(r.best.plan), tmp_path / "server.log", timeout=180)
    report = parse_log(output.splitlines())
    assert report.listening_url, output[-2000:]
    actual = report.by_device({ep: f"RPC{i}" for i, ep in enumerate(eps)})
    for g in gpus:
        used = sum(actual.get(g.name, {}).values()) * MiB
        limit = (g.total or 0) - margin
        print(f"{g.name}: {used / MiB:.2f} MiB used, {limit / MiB:.2f} MiB allowed")
        assert 0 < used <= limit + 0.01 * MiB * 4  # logged sizes are rounded to 0.01 MiB per buffer
