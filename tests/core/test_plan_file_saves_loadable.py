"""A plan file the planner writes loads again. A pasted command llama-server would refuse (``-t abc``)
is kept in the window with a note in Problems, and loading a file holding it is refused (hostile
extra_args); saving such a plan used to write a file that could not be opened again, losing the
plan's edits. Now the save is refused, naming the entry, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.command_text import plan_from_command
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.plan_file import PlanFile, PlanFileError, load_plan, save_plan

GiB = 1024**3


def _devices() -> DeviceSet:
    return DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB),
                     (Device("CUDA0", DeviceKind.CUDA, 24 * GiB, 24 * GiB),))


def test_a_plan_with_a_refused_pasted_flag_is_not_saved(small_models: dict[str, Path],
                                                        tmp_path: Path) -> None:
    base = plan_from_args(open_model(small_models["qwen3moe"]), _devices(), parse_server_args(["-c", "2048"]))
    bad, notes = plan_from_command(base, "llama-server -c 2048 -ngl 99 -t abc")
    assert any("-t" in n for n in notes)  # the window keeps it, with the refusal in Problems
    target = tmp_path / "bad.plan.json"
    with pytest.raises(PlanFileError) as e:
        save_plan(target, PlanFile.of(bad, {}))
    msg = str(e.value)
    assert str(target) in msg and "would not load again" in msg
    assert "$.extra_args[0]" in msg and "-t abc" in msg
    assert not target.exists() and list(tmp_path.iterdir()) == []  # nothing written, no temp left

    good, _ = plan_from_command(base, "llama-server -c 2048 -ngl 99 -t 4")
    save_plan(target, PlanFile.of(good, {}))
    assert load_plan(target).extra_args == ["-t", "4"]
