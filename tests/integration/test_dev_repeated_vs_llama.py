"""``-dev RPC0,RPC0`` on the real llama-server (one local ggml-rpc-server): the pinned build keeps both
mentions (src/llama.cpp 180-183), logs "pipeline parallelism enabled" and reserves compute buffers of
about three times the single device's (20.55 / 13.07 MiB against 7.01 / 4.02 for the small llama at
-c 2048). The planner projected the single device's; it now projects weights, KV and output to the
printed 0.01 MiB and the compute buffers within 5% (at -c 8192 ours are 42.55 / 37.07 MiB against
44.55 / 37.07: the two backends of one buffer type share one allocator in ggml-alloc, which the
simulation keeps apart)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import mib, rpc_devices, server_output

from offload_planner.backend.log_parser import parse_log
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.gguf_reader import open_model

pytestmark = pytest.mark.integration


def test_a_device_named_twice_loads_as_projected(small_models: dict[str, Path], llama_server: Path,
                                                  llama_bin_dir: Path, tmp_path: Path) -> None:
    model = open_model(small_models["llama"])
    with rpc_servers(llama_bin_dir, 1, tmp_path / "rpc") as eps:
        devices = rpc_devices(eps)
        figures = {}
        for dev in ("RPC0", "RPC0,RPC0"):
            args = ["--rpc", eps[0], "-m", str(small_models["llama"]), "-c", "8192", "-ngl", "999",
                    "-fit", "off", "-dev", dev]
            projection = analyse_command(model, devices, parse_server_args(args)).projection
            assert projection is not None
            output = server_output(llama_server, args, tmp_path / f"{dev}.log", timeout=180)
            report = parse_log(output.splitlines())
            assert report.listening_url, output[-3000:]
            assert ("pipeline parallelism enabled" in output) == (dev == "RPC0,RPC0")
            actual = report.by_device({eps[0]: "RPC0"})
            for dm in projection.devices:
                name = dm.device.name
                for kind in ("model", "kv", "output"):
                    theirs = actual.get(name, {}).get(kind, 0.0)
                    assert abs(mib(dm.total(kind)) - theirs) <= 0.011, (dev, name, kind)
                ours, theirs = mib(dm.total("compute")), actual[name]["compute"]
                assert abs(ours - theirs) <= 0.05 * theirs, (dev, name, ours, theirs)
                figures[dev, name] = theirs
        assert figures["RPC0,RPC0", "RPC0"] > 2 * figures["RPC0", "RPC0"], figures
