"""Every kind of edit is one undo command on the document; undo and redo restore the plan exactly."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.dialects import Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.units import GiB
from offload_planner.ui import commands
from offload_planner.ui.document import PlanDocument


@pytest.fixture
def doc(qtbot: QtBot, qwen3moe_path: Path) -> PlanDocument:
    model = open_model(qwen3moe_path)
    devices = DeviceSet(
        Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), (parse_device_decl("CUDA0=24GiB"),)
    )
    d = PlanDocument()
    d.reset(plan_from_args(model, devices, argparse.Namespace(ctx_size=4096)))
    qtbot.waitUntil(lambda: d.analysis_current)
    yield d
    d.shutdown()


def _undo_redo(doc: PlanDocument, before: Plan, after: Plan) -> None:
    doc.undo_stack.undo()
    assert doc.plan == before
    doc.undo_stack.redo()
    assert doc.plan == after


def test_move_then_move_back_leaves_no_move(doc: PlanDocument) -> None:
    name = "blk.1.ffn_down_exps.weight"
    before = doc.plan
    assert doc.move([name], CPU)
    assert doc.plan.moves == {name: CPU} and doc.placement.device_of(name) == CPU
    after = doc.plan
    _undo_redo(doc, before, after)
    assert doc.move([name], "CUDA0")  # where -ngl puts it: the move is cleared, not recorded
    assert doc.plan.moves == {}
    assert not doc.move([name], "CUDA0"), "no-op moves push nothing"
    assert doc.undo_stack.count() == 2


def test_option_edits_merge_into_one_step(doc: PlanDocument, qtbot: QtBot) -> None:
    before = doc.plan
    for n in (8192, 16384, 32768):
        doc.set_option("context.n_ctx", n, "context size")
    assert doc.undo_stack.count() == 1 and doc.plan.context.n_ctx == 32768
    doc.set_option("context.n_seq_max", 2, "-np")
    assert doc.undo_stack.count() == 2
    assert doc.plan.context.n_outputs_max == min(doc.plan.context.n_batch, 2)
    doc.undo_stack.undo()
    doc.undo_stack.undo()
    assert doc.plan == before
    qtbot.waitUntil(lambda: doc.analysis_current)
    assert doc.analysis is not None and "-c 4096" in " ".join(doc.analysis.command)


def test_add_and_remove_devices(doc: PlanDocument) -> None:
    before = doc.plan
    gpu = Device("CUDA1", DeviceKind.CUDA, 16 * GiB, None, source="declared")
    doc.add_device(gpu)
    assert doc.plan.devices.names == ["CUDA0", "CUDA1", "CPU"]
    with_gpu = doc.plan
    _undo_redo(doc, before, with_gpu)
    assert doc.placement.device_of("blk.0.ffn_up_exps.weight") == "CUDA0"
    assert doc.move(["blk.0.ffn_up_exps.weight"], "CUDA1")
    moved = doc.plan
    doc.remove_device("CUDA1")
    assert doc.plan.devices.names == ["CUDA0", "CPU"] and doc.plan.moves == {}, "moves onto it go too"
    doc.undo_stack.undo()
    assert doc.plan == moved, "undo brings the device and the moves back"
    doc.remove_device("CPU")  # the CPU cannot be removed
    assert doc.undo_stack.count() == 3


def test_margins_sizes_and_dialect(doc: PlanDocument) -> None:
    before = doc.plan
    doc.set_device_margin("CUDA0", 2 * GiB)
    doc.set_device_margin("CUDA0", 3 * GiB)
    assert doc.undo_stack.count() == 1 and doc.plan.devices.gpus[0].margin == 3 * GiB
    doc.set_device_size("CPU", 128 * GiB)
    assert doc.plan.devices.cpu.capacity == 128 * GiB
    doc.set_dialect("ik_llama.cpp", "ik_llama.cpp")
    assert doc.plan.dialect == "ik_llama.cpp" and not doc.plan.placement_options.output_first
    # the memory follows: ik's context rules, no CPU_REPACK; -mla only for DeepSeek-style models
    assert doc.plan.context.dialect == "ik_llama.cpp" and doc.plan.context.mla == 0
    assert not doc.plan.placement_options.use_extra_bufts
    assert not any(b.name == "CPU_REPACK" for b in doc.plan.projection().buffers())
    for _ in range(3):
        doc.undo_stack.undo()
    assert doc.plan == before


def test_replace_plan_and_command_texts(doc: PlanDocument) -> None:
    before = doc.plan
    doc.push(
        commands.ReplacePlan(
            doc,
            plan_from_args(before.model, before.devices, argparse.Namespace(ctx_size=1024)),
            "Paste command",
        )
    )
    assert doc.undo_stack.undoText() == "Paste command" and doc.plan.context.n_ctx == 1024
    doc.undo_stack.undo()
    assert doc.plan == before
    doc.move(["blk.0.ffn_up_exps.weight", "blk.0.ffn_gate_exps.weight"], CPU)
    assert doc.undo_stack.undoText().startswith("Move 2 tensors") and doc.undo_stack.undoText().endswith(
        "to CPU"
    )


def test_switching_a_deepseek_plan_to_ik_adds_what_ik_allocates(tmp_path: Path) -> None:
    """ik's default -mla 3 on a mainline-converted DeepSeek file: the attn_kv_b tensors ik computes
    at load (Q8_0, about 1 GiB for DeepSeek-V3) join the weights, the KV cache is the MLA c^KV, and
    the exported command says which MLA mode only when it is not ik's default."""
    from offload_planner.cli import demo_model_path
    from offload_planner.core.devices import Device, DeviceKind, DeviceSet
    from offload_planner.core.plan import plan_command
    from offload_planner.core.plan_edits import with_dialect, with_option

    model = open_model(demo_model_path())
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GiB, 500 * GiB), ())
    plan = plan_from_args(model, devices, argparse.Namespace(ctx_size=4096, n_parallel=1))
    ik = with_dialect(plan, "ik_llama.cpp")
    assert ik.context.mla == 3
    computed = sum(b.bytes for b in ik.projection().buffers() if b.kind == "model" and "computes" in b.why)
    # 61 layers x 512 x 128*(128+128) values in Q8_0 (34 bytes per 32), +32 B per CPU buffer
    assert computed == 61 * (512 * 32768 // 32 * 34 + 32)
    assert "-mla" not in plan_command(ik)
    mla1 = with_option(ik, "context.mla", 1)
    assert not any("computes" in b.why for b in mla1.projection().buffers())
    cmd = plan_command(mla1)
    assert cmd[cmd.index("-mla") + 1] == "1"
    back = with_dialect(ik, "llama.cpp")
    assert back.context.dialect == "llama.cpp" and back.context.mla == 0


def _ik_doc(qtbot: QtBot, qwen3moe_path: Path, argv: list[str]) -> PlanDocument:
    from offload_planner.core.cmdline import parse_server_args

    ik = Dialect("ik_llama.cpp")
    cpu = Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB)
    devices = DeviceSet(cpu, (parse_device_decl("CUDA0=24GiB"),))
    d = PlanDocument()
    d.reset(plan_from_args(open_model(qwen3moe_path), devices, parse_server_args(argv, dialect=ik).args, ik))
    qtbot.waitUntil(lambda: d.analysis_current)
    return d


def _host_weights(doc: PlanDocument, qtbot: QtBot) -> set[str]:
    """The buffer types of the CPU's weights in the window's projection."""
    qtbot.waitUntil(lambda: doc.analysis_current)
    analysis = doc.analysis
    assert analysis is not None and analysis.projection is not None
    return {b.name for b in analysis.projection.device("CPU").buffers if b.kind == "model"}


def test_ik_mmap_follows_a_move_to_the_cpu_and_its_undo(qtbot: QtBot, qwen3moe_path: Path) -> None:
    """ik turns mmap off for a weight sent to the CPU by a rule (the export's -ot NAME=CPU): the
    window's projection copies it into the pinned host buffer, as the exported command does (leftovers6)."""
    doc = _ik_doc(qtbot, qwen3moe_path, ["-c", "4096", "-ngl", "99"])
    try:
        before = doc.plan
        assert "CUDA_Host" not in _host_weights(doc, qtbot)
        assert doc.move(["blk.1.ffn_down_exps.weight"], CPU)
        assert not doc.plan.placement_options.use_mmap and "CUDA_Host" in _host_weights(doc, qtbot)
        _undo_redo(doc, before, doc.plan)
        doc.undo_stack.undo()
        assert doc.plan.placement_options.use_mmap and "CUDA_Host" not in _host_weights(doc, qtbot)
    finally:
        doc.shutdown()


def test_ticking_mmap_that_ik_turns_off_undoes_exactly(qtbot: QtBot, qwen3moe_path: Path) -> None:
    doc = _ik_doc(qtbot, qwen3moe_path, ["-c", "4096", "-ngl", "99", "-np", "1", "-ot", "exps=CPU"])
    try:
        before = doc.plan
        doc.set_option("placement.use_mmap", True, "mmap")
        assert not doc.plan.placement_options.use_mmap and "CUDA_Host" in _host_weights(doc, qtbot)
        doc.undo_stack.undo()
        assert doc.plan == before
        doc.set_dialect(Dialect("llama.cpp"), "llama.cpp")  # mainline maps a model with -ot exps=CPU
        assert doc.plan.placement_options.use_mmap and "CUDA_Host" not in _host_weights(doc, qtbot)
    finally:
        doc.shutdown()
