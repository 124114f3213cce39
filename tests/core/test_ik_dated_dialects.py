"""The dated ik_llama.cpp dialects (core/dialects/ik_2025.py, ik_amb256.py): picked by name everywhere a
dialect is (``--backend``, plan files), recognised from a server's ``--help`` where the build prints what
differs, and planned with their build's rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offload_planner.cli import main
from offload_planner.core.buffer import IK_CPU_BUFFER_EXTRA
from offload_planner.core.cmdline import detect_dialect, parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.dialects import IK, IK_2025, IK_2025_05, IK_AMB256, Dialect
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import Plan, plan_command, plan_from_args
from offload_planner.core.plan_file import PlanFile, load_plan, save_plan

ROOT = Path(__file__).resolve().parents[2]
DSV3 = str(ROOT / "resources" / "DeepSeek-V3-Q4_K_M.header.gguf")  # 61 layers, MLA
QWEN = str(ROOT / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")  # 48 layers, 128 experts
#: the -amb line of ik's --help (common.cpp gpt_params_print_usage) before and after PR 2312
HELP_AMB = "  -amb,  --attention-max-batch      max batch size for attention computations (default: {})\n"


def _devices() -> DeviceSet:
    return DeviceSet(parse_device_decl("CPU=512GiB"), (parse_device_decl("CUDA0=80GiB"),))


def _plan(path: str, dialect: Dialect, args: list[str]) -> Plan:
    return plan_from_args(open_model(path), _devices(), parse_server_args(args, dialect=dialect), dialect)


def _compute_mib(plan: Plan, name: str) -> float:
    return sum(b.bytes for b in plan.projection().buffers() if b.kind == "compute" and b.name == name) / 2**20


def test_amb_256_is_the_default_from_pr_2312() -> None:
    """A DeepSeek-V3 prompt batch of 4096 at 32k: the attn_kv_b expansion (4 GiB of f32) is cut into
    256 MiB steps by the new default, unlimited before; -amb 0 restores the old graph."""
    args = ["-c", "32768", "-ub", "4096", "-b", "4096", "-ngl", "99", "-ot", "exps=CPU"]
    new, old = _plan(DSV3, IK_AMB256, args), _plan(DSV3, IK, args)
    assert (new.context.amb, old.context.amb) == (256, 0)
    assert _compute_mib(new, "CUDA0") < _compute_mib(old, "CUDA0") - 1024
    off = _plan(DSV3, IK_AMB256, [*args, "-amb", "0"])
    assert off.context.amb == 0 and _compute_mib(off, "CUDA0") == _compute_mib(old, "CUDA0")
    # the exported command names -amb only where it differs from the build's default
    assert "-amb" not in plan_command(new)
    cmd = plan_command(off)
    assert cmd[cmd.index("-amb") + 1] == "0"
    cmd = plan_command(_plan(DSV3, IK, [*args, "-amb", "256"]))
    assert cmd[cmd.index("-amb") + 1] == "256"


def test_no_ngl_offloads_nothing_before_pr_2209() -> None:
    """ik before PR 2209 (2026-07-30) and mainline before b6050 load every layer on the CPU without
    -ngl; later builds offload everything (ik keeps 999, mainline resolves it to the 49 units)."""
    from offload_planner.core.dialects import LLAMA_CPP_2025, LLAMA_CPP_2025_EARLY

    for dialect, gpu_layers in ((IK_2025, 0), (IK, 999), (LLAMA_CPP_2025_EARLY, 0), (LLAMA_CPP_2025, 49)):
        plan = _plan(QWEN, dialect, ["-c", "4096"])
        assert plan.placement_options.n_gpu_layers == gpu_layers, dialect


def test_recognised_from_the_help_default() -> None:
    assert detect_dialect("", "  --mla-use N\n" + HELP_AMB.format(256)) is IK_AMB256
    assert detect_dialect("", "  --mla-use N\n" + HELP_AMB.format(0)) is IK
    assert detect_dialect("version: 3772 (5236c98b)", "  --run-time-repack\n") is IK


def _cli_plan(backend: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    code = main(["plan", QWEN, "--json", "--backend", backend, "--no-detect", "--device", "CUDA0=24GiB",
                 "--device", "CPU=512GiB", "--", "-c", "4096", "-ngl", "99", "-ot", "exps=CPU", "--no-mmap"])
    assert code == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def _host_model_buffers(out: dict[str, object]) -> list[tuple[str, int]]:
    devices = out["devices"]
    assert isinstance(devices, list)
    cpu = next(d for d in devices if d["name"] == "CPU")
    return [(b["name"], int(b["bytes"])) for b in cpu["buffers"] if b["kind"] == "model"]


def test_picked_by_name_in_the_plan_command(capsys: pytest.CaptureFixture[str]) -> None:
    """``plan --backend NAME`` takes the dated dialects: the 2025 one keeps the overridden experts in a
    plain CPU buffer (the token embedding alone in CUDA_Host); current ik and the -amb 256 build put
    every host weight in CUDA_Host (the same bytes, without the plain CPU buffer's extra)."""
    embd = open_model(QWEN).get("token_embd.weight")
    assert embd is not None
    dated = _host_model_buffers(_cli_plan("ik_llama.cpp-2025", capsys))
    assert [n for n, _ in dated] == ["CUDA_Host", "CPU"] and dated[0][1] == embd.nbytes
    for name in ("ik_llama.cpp", "ik_llama.cpp-2026-08"):
        current = _host_model_buffers(_cli_plan(name, capsys))
        assert [n for n, _ in current] == ["CUDA_Host"]
        assert current[0][1] == sum(b for _, b in dated) - IK_CPU_BUFFER_EXTRA


def test_plan_file_keeps_the_2025_rules(tmp_path: Path) -> None:
    """ik of 2025: -ot ...=CPU weights in a plain CPU buffer, the token embedding alone in CUDA_Host;
    the plan file keeps the dialect and its placement rule, and refuses a file that mixes them."""
    args = ["-c", "4096", "-ngl", "99", "-ot", "exps=CPU", "--no-mmap"]
    dated, current = _plan(QWEN, IK_2025, args), _plan(QWEN, IK, args)
    model_bufs = {b.name for b in dated.projection().buffers() if b.kind == "model"}
    assert {"CPU", "CUDA_Host"} <= model_bufs
    assert "CPU" not in {b.name for b in current.projection().buffers() if b.kind == "model"}
    host = [b for b in dated.projection().buffers() if b.kind == "model" and b.name == "CUDA_Host"]
    embd = open_model(QWEN).get("token_embd.weight")
    assert embd is not None and sum(b.bytes for b in host) == embd.nbytes
    path = tmp_path / "ik2025.json"
    save_plan(path, PlanFile.of(dated))
    data = json.loads(path.read_text())
    assert data["dialect"] == "ik_llama.cpp-2025" and load_plan(path).dialect is IK_2025
    data["placement_options"]["plain_cpu_overrides"] = False
    path.write_text(json.dumps(data))
    with pytest.raises(Exception, match="plain_cpu_overrides"):
        load_plan(path)


def test_host_overrides_turn_mmap_off_from_pr_1510() -> None:
    """Current ik (PR 1510): a weight overridden to the host turns mmap off, so --cpu-moe's experts and
    the token embedding land in one pinned CUDA_Host buffer; ik before it kept the mmap'd CPU span; an
    override to the GPU alone keeps mmap."""
    args = ["-c", "4096", "-ngl", "99", "--cpu-moe"]
    current, dated = _plan(QWEN, IK, args), _plan(QWEN, IK_2025, args)
    assert (current.placement_options.use_mmap, dated.placement_options.use_mmap) == (False, True)
    host = [b for b in current.projection().buffers() if b.kind == "model" and b.device == "CPU"]
    model = open_model(QWEN)
    exps = [t for t in model.tensors if t.role.is_routed_expert]
    embd = model.get("token_embd.weight")
    assert embd is not None and [b.name for b in host] == ["CUDA_Host"]
    assert host[0].bytes >= sum(t.nbytes for t in exps) + embd.nbytes
    dated_host = {b.name for b in dated.projection().buffers() if b.kind == "model" and b.device == "CPU"}
    assert dated_host == {"CPU"}  # the mmap span, as ik names it
    gpu_only = _plan(QWEN, IK, ["-c", "4096", "-ngl", "99", "-ot", r"blk\.1\.ffn_.*_exps=CUDA0"])
    assert gpu_only.placement_options.use_mmap
    assert plan_command(current)[-1] == "--no-mmap"


def test_rtr_speed_estimate_keeps_the_host_experts_on_the_cpu() -> None:
    """The speed estimate follows the compute simulation: with -rtr no prompt batch offloads the host
    experts (no transfer, the CPU does their prompt work), without it a 4096-token batch does."""
    from offload_planner.core.speed.estimate import estimate
    from offload_planner.core.speed.hardware import hardware_for

    ds = DeviceSet(parse_device_decl("CPU=512GiB,ram=8xDDR5-4800"), (parse_device_decl("CUDA0=rtx4090"),))
    hw = hardware_for(ds, threads=32)

    def ik(args: list[str]) -> Plan:
        return plan_from_args(open_model(QWEN), ds, parse_server_args(args, dialect=IK), IK)

    base = ["-c", "8192", "-ngl", "99", "--cpu-moe", "-ub", "4096", "-b", "4096", "--no-mmap"]
    off, rtr = estimate(ik(base), hw), estimate(ik([*base, "-rtr"]), hw)
    assert off.pp_transfer_ms > 0 and rtr.pp_transfer_ms == 0
    assert rtr.device("CPU").pp_ms > 10 * off.device("CPU").pp_ms


def test_switching_dialect_takes_its_amb_default() -> None:
    """The window's backend switch (plan_edits.with_dialect): the -amb 256 build's default comes with
    it, and leaving ik for mainline drops ik's -amb and -rtr."""
    from offload_planner.core.dialects import LLAMA_CPP
    from offload_planner.core.plan_edits import with_dialect

    plan = _plan(DSV3, IK, ["-c", "8192", "-ngl", "99", "-rtr"])
    assert (plan.context.amb, plan.context.repack) == (0, True)
    new = with_dialect(plan, IK_AMB256)
    assert (new.context.amb, new.context.repack) == (256, True)
    mainline = with_dialect(new, LLAMA_CPP).context
    assert (mainline.amb, mainline.repack) == (0, False)


@pytest.mark.parametrize(("exps", "dialect", "offloads"), [
    ("Q4_K_R4", IK, False),  # ik's CUDA backend has no Q4_K_R4 kernel: the experts' ops stay on the CPU
    ("IQ4_K_R4", IK, True),  # IQ*_K_R4 it multiplies (PRs 461/462 of May 2025) ...
    ("IQ4_K_R4", IK_2025_05, False),  # ... but not before them
])
def test_speed_estimate_keeps_interleaved_host_experts_on_the_cpu(tmp_path: Path, exps: str, dialect: Dialect,
                                                                 offloads: bool) -> None:
    """A file's own row-interleaved expert type decides, as in compute_ik, whether a 4096-token batch copies
    the host experts to the GPU."""
    from dataclasses import replace

    from offload_planner.core.speed.estimate import estimate
    from offload_planner.core.speed.hardware import hardware_for
    from offload_planner.core.synth import all_models, write_model
    from offload_planner.core.synth.ik_types import IkQ

    spec = all_models()["Qwen3-30B-A3B-Q4_K_M"]
    spec = replace(spec, quant=replace(spec.quant, exps=IkQ[exps], exps_down=IkQ[exps], more_bits=IkQ[exps]))
    path = tmp_path / "m.gguf"
    write_model(spec, path, header_only=True)
    ds = DeviceSet(parse_device_decl("CPU=512GiB,ram=8xDDR5-4800"), (parse_device_decl("CUDA0=rtx4090"),))
    args = ["-c", "8192", "-ngl", "99", "--cpu-moe", "-ub", "4096", "-b", "4096", "--no-mmap"]
    plan = plan_from_args(open_model(str(path)), ds, parse_server_args(args, dialect=dialect), dialect)
    est = estimate(plan, hardware_for(ds, threads=32))
    assert (est.pp_transfer_ms > 0) is offloads  # --cpu-moe: the experts are all the CPU's matrices
    assert (est.device("CPU").pp_ms > 10 * est.device("CUDA0").pp_ms) is not offloads
