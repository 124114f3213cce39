"""The window's Fastest plan (``fastest_from_plan``, from an open plan) and `fit`'s search
(``fastest_plan``, from a command line) are one search: the same candidates where neither has
baselines to add.  The window's search built its variants of the plan by edits and had no view of the
plan as a command (its argument parser was a stub): it could make no ``-ngl N`` variant, so on Metal
with mmap it lacked the top-layers candidate `fit` has (session 10's metal3), and it read the GPUs
to fill from llama-server's defaults, not the plan's ``-dev`` (two GPUs, ``-dev CUDA1``: a ValueError
from the layer layout, shown as "The fastest plan could not be searched")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, build_device_set, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import plan_command, plan_from_args
from offload_planner.core.speed.fastest import fastest_from_plan, fastest_plan
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.units import GiB

QWEN = Path(__file__).resolve().parents[2] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
MAINLINE = Dialect("llama.cpp")


@pytest.fixture(scope="module")
def qwen() -> Model:
    return open_model(QWEN)


def _devices(*decls: str, ram: int = 64) -> DeviceSet:
    cpu = Device("CPU", DeviceKind.CPU, ram * GiB, ram * GiB)
    return build_device_set(cpu=cpu, detected=[], rpc_endpoints=[],
                            declared=[parse_device_decl(d) for d in decls])


def _both(model: Model, ds: DeviceSet, args: list[str]) -> tuple[list[str], list[str], list[str], list[str]]:
    """The window's and fit's answers (commands) and candidate labels for the plan of ``args``."""
    plan = plan_from_args(model, ds, parse_server_args(args, dialect=MAINLINE), MAINLINE)
    hw = hardware_for(ds)
    win = fastest_from_plan(plan, hw)
    cli = fastest_plan(model, ds, plan_command(plan)[2:], hw, dialect=MAINLINE)
    assert win.best is not None and cli.best is not None, (win.why, cli.why)
    return (plan_command(win.best.plan), plan_command(cli.best.plan),
            [c.label for c in win.candidates], [c.label for c in cli.candidates])


def test_a_mac_gets_the_top_layers_candidate_in_the_window_too(qwen: Model) -> None:
    win, cli, win_labels, cli_labels = _both(qwen, _devices("MTL0=m2max,12GiB", ram=32), ["-c", "8192"])
    top = [lb for lb in cli_labels if re.fullmatch(r"-ngl \d+ \(mmap\)", lb)]
    assert top and top == [lb for lb in win_labels if re.fullmatch(r"-ngl \d+ \(mmap\)", lb)]
    assert win == cli  # the -lm none fill wins here, in both
    assert [lb for lb in cli_labels if lb != "--cpu-moe"] == win_labels  # the baseline: fit's only


def test_the_window_fills_the_gpus_dev_selects(qwen: Model) -> None:
    win, cli, _, _ = _both(qwen, _devices("CUDA0=12GiB", "CUDA1=12GiB"), ["-c", "8192", "-dev", "CUDA1"])
    assert win == cli and win[win.index("-dev") + 1] == "CUDA1"
    assert "CUDA0" not in " ".join(win)


def test_top_layers_over_by_a_full_projection_are_asked_again(tmp_path: Path) -> None:
    """A dense 70B on a 24 GiB MTL0 with mmap: the most top layers predicted to fit (-ngl 44, its compute
    buffer predicted from the plan with every layer on MTL0) are over once projected in full (with fewer
    layers on MTL0 its compute buffer holds the CPU weights op offload copies); the search then had no
    other candidate and said nothing fits. It now asks again with the buffers just simulated: the answer,
    in the window and in fit, is the largest N that fits by a full projection (N + 1 is over)."""
    from offload_planner.core.speed.candidate import room
    from offload_planner.core.synth import BIG_MODELS, write_model

    path = write_model(BIG_MODELS["Llama-3.1-70B-Q4_K_M"], tmp_path / "llama70.gguf", header_only=True)[0]
    model = open_model(path)
    ds = _devices("MTL0=m2max,24GiB", ram=64)
    win, cli, _, labels = _both(model, ds, ["-c", "8192"])
    assert win == cli
    n = int(cli[cli.index("-ngl") + 1])
    assert f"-ngl {n + 1} (mmap)" in labels  # the one predicted to fit, over by its full projection
    for k, over in ((n, False), (n + 1, True)):  # MTL0's room less the search's margin (1 GiB default)
        plan = plan_from_args(model, ds, parse_server_args(["-c", "8192", "-ngl", str(k)], dialect=MAINLINE),
                              MAINLINE)
        assert (room(plan.projection(), ds)["MTL0"] < 0) is over, k
