"""``-dev`` selecting fewer GPUs than the plan has, modelled as llama.cpp loads the main model.

``llama_prepare_model_devices`` (src/llama.cpp) makes ``model->devices`` the ``-dev`` list as given
(its order; ``-dev none``: no device) instead of every GPU; ``load_tensors`` splits the layers over
those devices only with ``-ts`` counting them alone, ``make_cpu_buft_list`` takes the host buffer type
from the first of them, and the context's scheduler has a backend for each of them and the CPU. So a
plan of two GPUs with ``-dev CUDA1`` is, buffer for buffer, the plan of CUDA1 alone, CUDA0 holding
nothing; the real server's buffers are compared in tests/integration/test_plan_vs_llama.py (RPC).
The DeepSeek-V3 header (61 layers, 62 units with the output) on declared CUDA devices.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.dialects import IK, LLAMA_CPP
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection
from offload_planner.core.model import Model
from offload_planner.core.plan_file import PlanFile, plan_from_json, plan_json
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import hardware_for

RES = Path(__file__).resolve().parents[2] / "resources"
CPU = parse_device_decl("CPU=1024GiB,ram=8xDDR5-4800")


@pytest.fixture(scope="module")
def ds3() -> Model:
    return open_model(str(RES / "DeepSeek-V3-Q4_K_M.header.gguf"))


def _devices(*gpus: str) -> DeviceSet:
    return DeviceSet(CPU, tuple(parse_device_decl(g) for g in gpus))


TWO = _devices("CUDA0=80GiB", "CUDA1=80GiB")


def _analyse(model: Model, devices: DeviceSet, args: str, dialect=LLAMA_CPP):  # type: ignore[no-untyped-def]
    parsed = parse_server_args(args.split(), dialect=dialect)
    assert not parsed.errors, parsed.errors
    return analyse_command(model, devices, parsed, dialect, command=True)


def _buffers(proj: Projection, device: str) -> list[tuple[str, str, int]]:
    return sorted((b.name, b.kind, b.bytes) for b in proj.device(device).buffers)


def test_dev_cuda1_of_two_is_the_plan_of_cuda1_alone(ds3: Model) -> None:
    """Every buffer (weights, KV, output, compute: the scheduler's backends are CUDA1 and the CPU) of
    CUDA1 and the CPU equals the plan where CUDA1 is the only GPU; CUDA0 holds nothing, and the speed
    estimate gives it no work."""
    args = "-ngl 99 -c 4096 -ot exps=CPU -fit off"
    sel = _analyse(ds3, TWO, f"-dev CUDA1 {args}")
    alone = _analyse(ds3, _devices("CUDA1=80GiB"), args)
    assert sel.projection is not None and alone.projection is not None
    assert sel.projection.device("CUDA0").total() == 0
    for dev in ("CUDA1", "CPU"):
        assert _buffers(sel.projection, dev) == _buffers(alone.projection, dev), dev
    assert sel.projection.device("CUDA1").total() > 9 * 1024**3  # the layers are there
    assert set(sel.projection.placement.unit_devices) == {"CUDA1"}
    assert "-dev CUDA1: llama-server uses CUDA1 only; CUDA0 holds nothing of the model" in sel.command_notes
    est = estimate(sel.plan, hardware_for(TWO, threads=16))
    assert {d.name for d in est.devices if d.share > 0} == {"CUDA1", "CPU"}
    cmd = sel.command
    assert cmd[cmd.index("-dev") + 1] == "CUDA1" and "-ts" not in cmd


def test_ts_counts_the_selected_gpus_in_dev_order(ds3: Model) -> None:
    """``-dev CUDA1,CUDA0 -ts 3,1``: the model's devices are CUDA1 then CUDA0, so the first three
    quarters of the 62 units (``upper_bound`` on the split points 0.75, 1) go to CUDA1. The exported
    command keeps the order and reads back to the same placement."""
    sel = _analyse(ds3, TWO, "-dev CUDA1,CUDA0 -ts 3,1 -ngl 99 -c 4096 -ot exps=CPU -fit off")
    assert sel.projection is not None
    units = sel.projection.placement.unit_devices
    n1 = math.ceil(0.75 * len(units))  # units u with u / 62 < 0.75
    assert units == ["CUDA1"] * n1 + ["CUDA0"] * (len(units) - n1)
    cmd = sel.command
    assert cmd[cmd.index("-dev") + 1] == "CUDA1,CUDA0"
    assert cmd[cmd.index("-ts") + 1] == f"{n1},{len(units) - n1}"
    again = _analyse(ds3, TWO, " ".join(cmd[2:]))  # without -m
    assert again.projection is not None
    assert again.projection.placement.tensor_devices() == sel.projection.placement.tensor_devices()
    assert again.command == cmd


def test_dev_none_offloads_nothing(ds3: Model) -> None:
    """``-dev none``: no model device, so every layer, the KV cache and the compute stay on the CPU,
    the CPU list without a GPU's host buffer type (as with no GPU at all); the GPUs hold nothing."""
    sel = _analyse(ds3, TWO, "-dev none -ngl 99 -c 4096 -fit off")
    cpu_only = _analyse(ds3, DeviceSet(CPU, ()), "-ngl 99 -c 4096 -fit off")
    assert sel.projection is not None and cpu_only.projection is not None
    for gpu in ("CUDA0", "CUDA1"):
        assert sel.projection.device(gpu).total() == 0
    assert _buffers(sel.projection, "CPU") == _buffers(cpu_only.projection, "CPU")
    assert "-dev none: llama-server uses no GPU; CUDA0, CUDA1 hold nothing of the model" in sel.command_notes
    assert sel.command[sel.command.index("-dev") + 1] == "none"


def test_ot_naming_a_gpu_dev_leaves_out_is_a_warning(ds3: Model) -> None:
    """The real server loads weights an -ot puts on an unselected device, then aborts while reserving
    its compute buffers (tests/integration/test_plan_reads_like_llama_server.py): the plan says so."""
    a = _analyse(ds3, TWO, r"-dev CUDA1 -ngl 99 -c 4096 -ot blk\.3\.=CUDA0 -ot exps=CPU -fit off")
    said = [w for w in a.warnings if w.startswith("CUDA0 holds 18 weight(s)")]
    assert said and "-dev CUDA1 leaves CUDA0 out" in said[0] and "aborts" in said[0], a.warnings
    ok = _analyse(ds3, TWO, r"-dev CUDA1 -ngl 99 -c 4096 -ot blk\.3\.=CUDA1 -ot exps=CPU -fit off")
    assert not [w for w in ok.warnings if "leaves" in w]


def test_fit_fits_the_selected_gpus_only(ds3: Model) -> None:
    """llama.cpp's --fit measures and fits ``model->devices``: with ``-dev CUDA1`` the fit of two GPUs
    is the fit of CUDA1 alone (the same -c, -ngl and -ot), and its command keeps ``-dev CUDA1``."""
    from offload_planner.core.analysis import fit_report
    from offload_planner.core.plan import plan_from_args

    two = _devices("CUDA0=80GiB", "CUDA1=24GiB")
    args = ["-c", "16384"]
    parsed = parse_server_args(["-dev", "CUDA1", *args])
    sel = fit_report(plan_from_args(ds3, two, parsed), parsed)
    alone_args = parse_server_args(args)
    alone = fit_report(plan_from_args(ds3, _devices("CUDA1=24GiB"), alone_args), alone_args)
    assert sel.summary is not None and alone.summary is not None
    assert sel.summary["status"] == alone.summary["status"] == "success"
    cmd = sel.summary["command"]
    assert isinstance(cmd, list) and cmd[cmd.index("-dev") + 1] == "CUDA1"
    assert [a for a in cmd if a not in ("-dev", "CUDA1")] == alone.summary["command"]
    fitted = _analyse(ds3, two, " ".join(cmd[2:]))
    assert fitted.projection is not None and fitted.projection.device("CUDA0").total() == 0


def test_the_fastest_plan_fills_the_selected_gpus_only() -> None:
    """The search moves experts only to the GPUs ``-dev`` selects (a move to another is a load the
    server aborts), and its layer split (-ts) counts them in -dev's order."""
    from offload_planner.core.plan import plan_command
    from offload_planner.core.speed.fastest import fastest_plan

    qwen = open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))
    ds = _devices("CUDA0=12GiB", "CUDA1=12GiB")
    r = fastest_plan(qwen, ds, ["-c", "8192", "-dev", "CUDA1"], hardware_for(ds, threads=16), goal="tg")
    assert r.best is not None and r.candidates
    for c in r.candidates:
        assert "CUDA0" not in set(c.plan.placement().tensor_devices().values()), c.label
    cmd = plan_command(r.best.plan)
    assert cmd[cmd.index("-dev") + 1] == "CUDA1"


def test_names_are_matched_as_the_dialect_matches_them() -> None:
    """The pinned build matches -dev names ignoring case (``striequals``); ik_llama.cpp looks the name
    up as written (a name it does not know is left out: ``backend not available``)."""
    gpus = [parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")]  # the GPUs, not names
    assert LLAMA_CPP.selected_gpus(["cuda1", "CUDA0"], gpus) == ("CUDA1", "CUDA0")
    assert IK.selected_gpus(["CUDA1"], gpus) == ("CUDA1",)
    assert IK.selected_gpus(["cuda1", "CUDA0"], gpus) == ("CUDA0",)
    assert LLAMA_CPP.selected_gpus(["none"], gpus) == ()
    assert LLAMA_CPP.selected_gpus(None, gpus) is None


def test_a_plan_file_keeps_the_selection(ds3: Model) -> None:
    """A saved plan keeps ``-dev``'s GPUs in its placement options (and writes nothing new without
    one: files of plans without -dev stay as they were)."""
    sel = _analyse(ds3, TWO, "-dev CUDA1 -ngl 99 -c 4096 -fit off")
    data = plan_json(PlanFile.of(sel.plan))
    assert data["placement_options"]["selected"] == ["CUDA1"]
    back = plan_from_json(json.loads(json.dumps(data)))
    assert back.placement_options == sel.plan.placement_options
    plain = _analyse(ds3, TWO, "-ngl 99 -c 4096 -fit off")
    assert "selected" not in plan_json(PlanFile.of(plain.plan))["placement_options"]


def test_a_plan_file_with_dev_in_its_extra_args_keeps_the_selection(ds3: Model) -> None:
    """Files saved before the plan wrote -dev itself kept it in extra_args, verbatim: such a file loads
    with the selection in its placement options and -dev out of extra_args (the command has it once)."""
    plain = _analyse(ds3, TWO, "-ngl 99 -c 4096 -fit off")
    data = json.loads(json.dumps(plan_json(PlanFile.of(plain.plan))))
    for given in (["-dev", "cuda1", "--port", "8081"], ["--port", "8081", "--device", "CUDA1"]):
        data["extra_args"] = given
        back = plan_from_json(data)
        assert back.placement_options.selected == ("CUDA1",)
        assert back.extra_args == ["--port", "8081"]


@pytest.mark.parametrize("dialect", [LLAMA_CPP, IK], ids=str)
def test_the_draft_takes_the_main_selection_unless_devd_names_its_own(dialect) -> None:  # type: ignore[no-untyped-def]
    """``common_base_params_to_speculative`` (pinned: "default to global devices value"; ik's
    common/speculative.cpp: ``params.devices.empty() ? params_base.devices : params.devices``): the
    draft model loads on ``-devd``'s devices, else on the main ``-dev``'s (checked on the real server in
    tests/integration/test_speculative_vs_llama.py)."""
    for extra, want in (([], ["CUDA1"]), (["-devd", "CUDA0"], ["CUDA0"])):
        p = parse_server_args(["-dev", "CUDA1", "-md", "draft.gguf", *extra], dialect=dialect)
        assert not p.errors, p.errors
        d = dialect.draft_server_args(p.args, p.args.draft, bool(extra))
        assert d.devices == want


def test_a_selected_gpu_removed_from_the_plan_is_left_out(ds3: Model) -> None:
    """The window can remove a GPU a -dev selected: the plan then has no GPU to offload to (as the
    projection shows), and its command and file say -dev none rather than name a GPU it lacks."""
    from dataclasses import replace

    from offload_planner.core.plan import plan_command
    from offload_planner.core.plan_edits import without_device

    sel = _analyse(ds3, TWO, "-dev CUDA1 -ngl 99 -c 4096 -fit off")
    plan, _, _ = without_device(sel.plan, "CUDA1")
    assert plan.projection().device("CUDA0").total() == 0
    cmd = plan_command(plan)
    assert cmd[cmd.index("-dev") + 1] == "none"
    back = plan_from_json(json.loads(json.dumps(plan_json(PlanFile.of(plan)))))
    assert back.placement_options == replace(plan.placement_options, selected=())


def test_rpc_servers_are_written_in_their_numbers_order(ds3: Model) -> None:
    """A launch reads the device set back from the server's log in the order it lists them, which with
    ``-dev RPC1`` is RPC1 first (``devices_from_log``); ``--rpc`` must still list RPC0's server first,
    or the exported ``-dev RPC1`` names the other server."""
    from offload_planner.core.devices import Device, DeviceKind
    from offload_planner.core.plan import plan_command

    rpc0 = Device("RPC0", DeviceKind.RPC, 24 * 1024**3, 24 * 1024**3, source="rpc", endpoint="10.0.0.1:50052")
    rpc1 = Device("RPC1", DeviceKind.RPC, 24 * 1024**3, 24 * 1024**3, source="rpc", endpoint="10.0.0.2:50052")
    logged = DeviceSet(CPU, (rpc1, rpc0), reported_order=True)
    a = _analyse(ds3, logged, "--rpc 10.0.0.1:50052,10.0.0.2:50052 -dev RPC1 -ngl 99 -c 4096 -fit off")
    cmd = plan_command(a.plan)
    assert cmd[cmd.index("--rpc") + 1] == "10.0.0.1:50052,10.0.0.2:50052"
    assert cmd[cmd.index("-dev") + 1] == "RPC1"


def test_ik_graph_split_counts_the_selected_gpus() -> None:
    """ik's ``-sm graph`` needs two model devices: with ``-dev CUDA1`` it has one, which ik refuses
    ("less than 2 devices", check_semantics), so the plan does not also describe a graph split."""
    from offload_planner.core.cmdline import check_semantics

    qwen = open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))
    for extra, split_said in (([], True), (["-dev", "CUDA1"], False)):
        p = parse_server_args(["-sm", "graph", "-ngl", "99", "-c", "4096", *extra], dialect=IK)
        refused = [e for e in check_semantics(p, TWO.names) if "less than 2 devices" in e.message]
        assert bool(refused) is not split_said
        said = [w for w in analyse_command(qwen, TWO, p, IK).warnings if w.startswith("-sm graph")]
        assert bool(said) is split_said


def test_the_2025_cpu_rule_note_follows_the_selections_host_buffer(ds3: Model) -> None:
    """2025 builds: the note on ``-ot ...=CPU`` taking a GPU's host buffer type is about the model's
    first device with one: with ``-dev none`` there is none, and the CPU rule takes the plain CPU type."""
    from offload_planner.core.dialects import LLAMA_CPP_2025

    for dev, said in (("CUDA1", True), ("none", False)):
        a = _analyse(ds3, TWO, f"-dev {dev} -ngl 99 -c 4096 -ot exps=CPU", LLAMA_CPP_2025)
        assert any(n.startswith("two rules for -ot ...=CPU") for n in a.command_notes) is said, dev


def test_fit_asks_only_for_the_selected_gpus_memory(ds3: Model) -> None:
    """--fit measures the model's devices: a GPU -dev leaves out may have no known size (an RPC server
    not declared), and the fit still runs; the note asking for sizes names only selected GPUs."""
    from offload_planner.core.analysis import fit_report
    from offload_planner.core.devices import Device, DeviceKind
    from offload_planner.core.plan import plan_from_args

    rpc = Device("RPC0", DeviceKind.RPC, source="rpc", endpoint="10.0.0.1:50052")  # size unknown
    devices = DeviceSet(CPU, (rpc, parse_device_decl("CUDA0=24GiB")))
    for dev, runs in (("CUDA0", True), ("RPC0", False)):
        parsed = parse_server_args(["--rpc", "10.0.0.1:50052", "-dev", dev, "-c", "16384"])
        report = fit_report(plan_from_args(ds3, devices, parsed), parsed)
        assert (report.summary is not None) is runs, dev
        asked = [n for n in report.notes if "declare" in n]
        assert (asked == []) is runs and all("CUDA0" not in n for n in asked), report.notes
