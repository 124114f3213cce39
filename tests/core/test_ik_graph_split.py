"""ik_llama.cpp's ``-sm graph``/``attn``: which architectures it splits, and where it refuses.

ik builds the model's devices from its GPUs (``-dev``'s, else every one); the CPU is not one of them.
With fewer than two, a model it splits by graph throws at load ("It is not possible to use split mode
'graph' with less than 2 devices", src/llama.cpp 4369-4372 at 8337e4cd); a model it does not split
changes to ``-sm layer`` first (4225-4241) and loads.  The check counted the CPU among the devices
(``DeviceSet.names`` ends with it), so one GPU never was refused, and it ignored the architecture;
its list of architectures was December 2025's (deepseek2 is split since 2026-05-19)."""

from __future__ import annotations

from pathlib import Path

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import check_semantics, parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.units import GiB

RES = Path(__file__).resolve().parents[2] / "resources"
IK = Dialect("ik_llama.cpp")
CPU = Device("CPU", DeviceKind.CPU, 512 * GiB, 512 * GiB)
ONE = DeviceSet(CPU, (parse_device_decl("CUDA0=24GiB"),))
TWO = DeviceSet(CPU, (parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")))


def _refused(args: str, devices: DeviceSet, arch: str | None) -> list[str]:
    parsed = parse_server_args(args.split(), dialect=IK)
    return [f"{e.flag} {e.value}: {e.message}" for e in check_semantics(parsed, devices.names, arch=arch)
            if "less than 2 devices" in e.message]


def test_one_gpu_is_refused_for_a_model_ik_splits() -> None:
    for sm in ("graph", "attn"):
        assert _refused(f"-sm {sm} -ngl 99", ONE, "qwen3moe") == [
            f"-sm {sm}: It is not possible to use split mode 'graph' with less than 2 devices"]
        assert _refused(f"-sm {sm} -ngl 99", DeviceSet(CPU, ()), "deepseek2")  # no GPU: no device
        assert _refused(f"-sm {sm} -ngl 99 -dev CUDA1", TWO, "llama")
        assert not _refused(f"-sm {sm} -ngl 99", TWO, "qwen3moe")
        assert not _refused(f"-sm {sm} -ngl 99", ONE, "gemma3")  # ik changes it to layer and loads
        assert _refused(f"-sm {sm} -ngl 99", ONE, None)  # the model unknown (a plan file's check)


def test_deepseek_is_split_by_graph_and_old_architectures_change_to_layer() -> None:
    ds = open_model(RES / "DeepSeek-V3-Q4_K_M.header.gguf")
    parsed = parse_server_args(["-sm", "graph", "-ngl", "99", "-c", "4096", "-ot", "exps=CPU"], dialect=IK)
    warned = [w for w in analyse_command(ds, TWO, parsed, IK).warnings if w.startswith("-sm graph")]
    assert warned and "spreads each layer's tensors over the GPUs" in warned[0], warned
    assert IK.graph_split_archs < Dialect("ik_llama.cpp-2026-08").graph_split_archs  # + muse-glimmer
