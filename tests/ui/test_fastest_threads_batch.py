"""The window's Fastest plan estimates a prompt with the plan's -tb (llama.cpp decodes a batch of more than
one token on n_threads_batch: src/llama-context.cpp graph_compute), as plan and fit do; it ranked every
candidate's pp with -t's threads before."""

from __future__ import annotations

from pathlib import Path

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.ui.presets_menu import fastest_plan

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"


def test_fastest_plan_ranks_the_prompt_with_threads_batch() -> None:
    model = open_model(QWEN)
    ds = DeviceSet(parse_device_decl("CPU=64GiB,ram=2xDDR5-4800,cores=16"), ())  # the CPU computes it all

    def pp(args: str) -> float:
        result = fastest_plan(plan_from_args(model, ds, parse_server_args(args.split())), goal="pp")
        assert result.best is not None, result.why
        return result.best.estimate.pp_tps

    split = pp("-c 4096 -t 4 -tb 16")
    assert split == pp("-c 4096 -t 16") != pp("-c 4096 -t 4")
