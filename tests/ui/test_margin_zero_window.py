"""A margin of 0 set in the window keeps nothing free in the fastest-plan search (core.speed.candidate
.margin_of), where a margin never set keeps the default 1 GiB; undo brings the default back."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.candidate import DEFAULT_MARGIN, margin_of
from offload_planner.core.units import GiB
from offload_planner.ui.document import PlanDocument


@pytest.fixture
def doc(qtbot: QtBot, qwen3moe_path: Path) -> Iterator[PlanDocument]:
    model = open_model(qwen3moe_path)
    cpu = Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB)
    devices = DeviceSet(cpu, (parse_device_decl("CUDA0=24GiB"),))
    d = PlanDocument()
    d.reset(plan_from_args(model, devices, argparse.Namespace(ctx_size=4096)))
    qtbot.waitUntil(lambda: d.analysis_current)
    yield d
    d.shutdown()


def _cuda0(doc: PlanDocument) -> Device:
    dev = doc.plan.devices.by_name("CUDA0")
    assert dev is not None
    return dev


def test_a_margin_of_0_set_in_the_window_is_no_margin(doc: PlanDocument) -> None:
    before = doc.plan
    assert margin_of(_cuda0(doc)) == DEFAULT_MARGIN  # not set: the default
    doc.set_device_margin("CUDA0", 0)  # the panel shows 0: the search must keep 0 free, not 1 GiB
    assert doc.undo_stack.count() == 1 and margin_of(_cuda0(doc)) == 0
    doc.set_device_margin("CUDA0", 2 * GiB)
    assert margin_of(_cuda0(doc)) == 2 * GiB
    doc.set_device_margin("CUDA0", 0)
    assert margin_of(_cuda0(doc)) == 0
    doc.undo_stack.undo()
    assert doc.plan == before and margin_of(_cuda0(doc)) == DEFAULT_MARGIN
