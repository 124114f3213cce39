"""Devices as llama.cpp lists them, and device sizes as a user writes them."""

from __future__ import annotations

import math

import pytest

from offload_planner.core.cmdline.cnum import CNumberError, ignored_tail, stof, stoi
from offload_planner.core.devices import (
    Device,
    DeviceKind,
    DeviceSet,
    build_device_set,
    declared_name_problem,
    parse_device_decl,
    parse_device_decls,
)
from offload_planner.core.errors import PlannerError
from offload_planner.core.placement import unit_devices

CPU = Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30)


def test_devices_take_llama_cpp_order_whatever_order_they_are_declared_in() -> None:
    """RPC servers first in --rpc order, then backends in registration order (CUDA before
    Vulkan: ggml-backend-reg.cpp), each by index."""
    declared = [parse_device_decl(d) for d in ("Vulkan0=8GiB", "CUDA1=24GiB", "CUDA0=12GiB", "RPC1=64GiB")]
    devices = build_device_set(cpu=CPU, detected=[], rpc_endpoints=["10.0.0.1:50052", "10.0.0.2:50052"],
                               declared=declared)
    assert devices.names == ["RPC0", "RPC1", "CUDA0", "CUDA1", "Vulkan0", "CPU"]
    rpc1 = devices.by_name("RPC1")
    assert rpc1 is not None and rpc1.endpoint == "10.0.0.2:50052" and rpc1.capacity == 64 << 30
    assert [d.name for d in DeviceSet(CPU, tuple(reversed(devices.gpus))).gpus] == devices.names[:-1]


def test_ten_devices_sort_by_number_not_text() -> None:
    gpus = tuple(Device(f"CUDA{i}", DeviceKind.CUDA) for i in (10, 2, 1, 0))
    assert [d.name for d in DeviceSet(CPU, gpus).gpus] == ["CUDA0", "CUDA1", "CUDA2", "CUDA10"]


@pytest.mark.parametrize("decl", ["CUDA0=24", "CUDA0=24GiB,free=20", "CUDA0=24GiB,margin=1", "CUDA0=２４GiB"])
def test_a_size_needs_its_unit(decl: str) -> None:
    with pytest.raises(PlannerError, match=r"--device .*24GiB.*4096B"):
        parse_device_decl(decl)


@pytest.mark.parametrize(("decl", "total"), [("CUDA0=4096B", 4096), ("CUDA0=24GB", 24 * 10**9),
                                             ("CUDA0=24G", 24 * 2**30), ("CUDA0=1.5TiB", 3 * 2**39)])
def test_the_accepted_forms(decl: str, total: int) -> None:
    assert parse_device_decl(decl).total == total


def test_c_number_parsing_reads_ascii_digits_only() -> None:
    for text in ("１２３", "٣", "x1"):
        with pytest.raises(CNumberError):
            stoi(text)
    with pytest.raises(CNumberError):
        stof("１.５")
    assert stoi(" 12k") == 12 and ignored_tail(" 12k") == "k" and ignored_tail("12") == ""
    assert ignored_tail("1.5x", floating=True) == "x" and ignored_tail("nan", floating=True) == ""
    assert math.isnan(stof("nan")) and stof("-inf") == -math.inf


@pytest.mark.parametrize("split", [(math.nan,), (math.inf, 1.0), (1.0, -1.0), (-1.0, 2.0)])
def test_a_split_llama_cpp_cannot_use_still_projects(split: tuple[float, ...]) -> None:
    """The window projects whatever is typed; the refusal itself is cmdline.check_semantics'."""
    gpus = [Device("CUDA0", DeviceKind.CUDA, 24 << 30), Device("CUDA1", DeviceKind.CUDA, 8 << 30)]
    units = unit_devices(4, 5, gpus, split, output_first=True)
    assert units == unit_devices(4, 5, gpus, (0.0, 0.0), output_first=True)


def test_metal_devices_are_named_as_the_pinned_build_names_them() -> None:
    """The pinned build's Metal device and its default buffer type are ``MTL<i>``
    (ggml/src/ggml-metal/ggml-metal-device.m:1301: ``"%s%d", "MTL", device``; ggml-metal.cpp:15
    ``GGML_METAL_NAME "MTL"``): the planner named it Metal0, which that llama-server refuses in -ot and
    -dev. ``Metal0`` is still read (old commands' --device values, plan files) as MTL0."""
    for text in ("MTL0=64GiB", "Metal0=64GiB", "mtl0=64GiB", "metal0=64GiB"):
        d = parse_device_decl(text)
        assert (d.name, d.kind, d.buffer_type) == ("MTL0", DeviceKind.METAL, "MTL0"), text
    assert parse_device_decl("MTL1=m2ultra,192GiB").name == "MTL1"
    assert "MTL0, MTL1" in declared_name_problem("MTL")
    assert "MTL1 (no leading zero)" in declared_name_problem("Metal01")
    with pytest.raises(PlannerError, match="already declared"):
        parse_device_decls(["Metal0=64GiB", "MTL0=64GiB"])
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30), (parse_device_decl("MTL0=64GiB"),))
    assert devices.by_name("Metal0") is devices.gpus[0]
    assert devices.resolve_buffer_type("MTL0") == "MTL0"
    assert devices.resolve_buffer_type("Metal0") is None  # the pinned server refuses -ot ...=Metal0
    with pytest.raises(PlannerError, match="MTL0=m3max"):
        parse_device_decl("m3max")  # a catalogue Apple card without its device: the hint names MTL0
