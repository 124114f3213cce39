"""The estimate's assumptions come in the devices' order in every process: the RPC devices' measured
round trips were listed in the order of a set of device names, which follows the process's string
hash seed, so two runs of the same ``plan --json`` printed them in different orders (caught by the
integration test comparing ``-dev rpc1`` with ``-dev RPC1`` on a clean-clone CI run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from offload_planner.core.synth import SMALL_MODELS, write_model

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
from dataclasses import replace
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import Figure, Source, hardware_for

GiB = 1024**3
gpus = tuple(Device(f"RPC{i}", DeviceKind.RPC, 8 * GiB, 8 * GiB, endpoint=f"127.0.0.1:{5000 + i}")
             for i in range(4))
ds = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), gpus)
plan = plan_from_args(open_model(sys.argv[1]), ds, parse_server_args(["-ngl", "99", "-c", "512"]))
hw = hardware_for(ds, threads=2)
for i in range(4):
    hw.devices[f"RPC{i}"] = replace(hw[f"RPC{i}"], latency_us=Figure(50.0 + i, "us", Source.MEASURED, "test"))
print([a.what for a in estimate(plan, hw, eff=DEFAULT).assumptions if "round trip" in a.what])
"""


def test_rpc_round_trips_in_the_devices_order_whatever_the_hash_seed(tmp_path: Path) -> None:
    model = write_model(SMALL_MODELS["llama"], tmp_path / "llama.gguf")[0]
    want = str([f"RPC{i} RPC round trip per split" for i in range(4)])
    for seed in ("0", "1", "2", "3", "4", "5"):
        env = {**os.environ, "PYTHONPATH": str(ROOT / "gui"), "PYTHONHASHSEED": seed}
        r = subprocess.run([sys.executable, "-c", SCRIPT, str(model)], capture_output=True, text=True,
                           timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == want, (seed, r.stdout)
