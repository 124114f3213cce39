"""``-dev RPC0,RPC0`` and ``-devd RPC0,RPC0`` on the real llama-server (one local ggml-rpc-server): the
pinned build keeps both mentions (src/llama.cpp 180-183; the draft takes ``-devd``'s list the same
way), logs "pipeline parallelism enabled" and reserves compute buffers of about three times the single
device's (20.55 / 13.07 MiB against 7.01 / 4.02 for the small llama at -c 2048). The planner
projected the single device's; it now projects every buffer to the printed 0.01 MiB (compute at
-c 8192: 44.55 / 37.07 MiB; 42.55 before the scheduler modelled what one device's two backends do:
the forced norms land on the last backend of the layer's device, pass 3 upgrades a node to the first
where every source is in its buffer type, leaving layer 0's norm, fed from the CPU, on the second: a
third split, whose inputs the two backends' shared allocator holds)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import mib, rpc_devices, server_output
from tests.support.spec_log import split_log

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.extra_context import DRAFT
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection

pytestmark = pytest.mark.integration

#: the context each case names twice: the main model's (-dev) or the draft's (-devd)
CASES = [("-dev", ""), ("-devd", DRAFT)]


def _check(projection: Projection, owner: str, actual: dict[str, dict[str, float]], dev: str) -> float:
    """Every buffer to the printed 0.01 MiB; RPC0's compute (MiB)."""
    for dm in projection.devices:
        name = dm.device.name
        for kind in ("model", "kv", "output", "compute"):
            ours = mib(sum(b.bytes for b in dm.buffers if b.kind == kind and b.owner == owner))
            theirs = actual.get(name, {}).get(kind, 0.0)
            assert abs(ours - theirs) <= 0.011, (dev, name, kind, ours, theirs)
    return actual["RPC0"]["compute"]


@pytest.mark.parametrize(("flag", "owner"), CASES)
def test_a_device_named_twice_loads_as_projected(flag: str, owner: str, small_models: dict[str, Path],
                                                  llama_server: Path, llama_bin_dir: Path,
                                                  tmp_path: Path) -> None:
    model = open_model(small_models["llama"])
    draft = ["-md", str(small_models["llama-draft"])] if owner else []
    with rpc_servers(llama_bin_dir, 1, tmp_path / "rpc") as eps:
        devices = rpc_devices(eps)
        compute = {}
        for dev in ("RPC0", "RPC0,RPC0"):
            args = ["--rpc", eps[0], "-m", str(small_models["llama"]), "-c", "8192", "-ngl", "999",
                    "-fit", "off", *draft, flag, dev]
            projection = analyse_command(model, devices, parse_server_args(args)).projection
            assert projection is not None and [e.key for e in projection.extras] == ([DRAFT] if owner else [])
            output = server_output(llama_server, args, tmp_path / f"{dev}.log", timeout=180)
            assert "listening on http://" in output, output[-3000:]
            main, extra = split_log(output.splitlines(), {eps[0]: "RPC0"})
            assert output.count("pipeline parallelism enabled") == (dev == "RPC0,RPC0")
            compute[dev] = _check(projection, owner, extra if owner else main, dev)
        assert compute["RPC0,RPC0"] > 2 * compute["RPC0"], compute
