"""Multimodal projectors without a server: the synth files, the header reader, where the projector
goes, what it adds to a plan (table, JSON, bars' totals, export, --fit targets, the fastest-plan
search) and bad input.  ``tests/integration/test_mmproj_vs_llama.py`` compares the sizes with the
real llama-server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.errors import GGUFError
from offload_planner.core.fit import fit_for_args
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.mmproj import MmprojOptions, mmproj_device, project_mmproj, read_projector
from offload_planner.core.mmproj.attach import KIND, argv_mmproj_setup, fit_targets, mmproj_setup
from offload_planner.core.plan import plan_command, plan_from_args
from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.core.synth.mmproj import BIG_MMPROJ, SMALL_MMPROJ, mmproj_tensors, write_mmproj
from offload_planner.core.synth.quant import tensor_nbytes

MiB = 1024**2
GiB = 1024**3
RES = Path(__file__).resolve().parents[2] / "resources"
CPU = Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB)


def _rpc(n: int) -> tuple[Device, ...]:
    return tuple(Device(f"RPC{i}", DeviceKind.RPC, 8 * GiB, 8 * GiB, endpoint=f"127.0.0.1:{5000 + i}")
                 for i in range(n))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mmproj")
    out = {name: write_mmproj(spec, root / f"{name}.gguf") for name, spec in SMALL_MMPROJ.items()}
    out |= {name: write_mmproj(spec, root / f"{name}.gguf", header_only=True)
            for name, spec in BIG_MMPROJ.items()}
    out["text"] = write_model(SMALL_MODELS["gemma3"], root / "text-gemma3.gguf")[0]
    return out


@pytest.mark.parametrize("name", [*SMALL_MMPROJ, *BIG_MMPROJ])
def test_written_projector_reads_back(name: str, files: dict[str, Path]) -> None:
    spec = {**SMALL_MMPROJ, **BIG_MMPROJ}[name]
    p = read_projector(files[name])
    expected = mmproj_tensors(spec)
    assert [(t.name, t.shape, t.type.name) for t in p.tensors] == [
        (n, s, q.name.lower()) for n, s, q in expected]
    assert p.weight_bytes == sum(tensor_nbytes(q, s) for _, s, q in expected)
    assert (p.proj_type, p.n_embd, p.n_layer, p.image_size, p.n_embd_out) == (
        spec.proj_type, spec.n_embd, spec.n_layer, spec.image_size,
        spec.n_embd_text * (1 + len(spec.deepstack)))  # Qwen3-VL: deepstack features too
    assert p.deepstack == list(spec.deepstack)
    if spec.proj_type == "gemma3":
        assert p.n_merge == (spec.n_merge or 4)  # clip.cpp's Gemma 3 default when the key is absent
    size = os.path.getsize(files[name])
    assert (size > p.weight_bytes) == (name in SMALL_MMPROJ)  # loadable ones carry their data


def test_real_gemma3_projector_sizes(files: dict[str, Path]) -> None:
    """SigLIP-so400m as in gemma-3-27b-it's mmproj-model-f16.gguf: 27 blocks of 1152, 896 px."""
    p = read_projector(files["gemma-3-27b-mmproj-f16"])
    assert len(p.tensors) == 5 + 16 * 27 + 2
    assert 790 * MiB < p.weight_bytes < 820 * MiB  # the published file is 818 MB
    cuda = parse_device_decl("CUDA0=24GiB")
    mb = project_mmproj(p, DeviceSet(CPU, (cuda,)), MmprojOptions())
    assert mb.device == "CUDA0" and mb.weights >= p.weight_bytes
    # the CPU backend holds only the raw warmup image: 896 x 896 x 3 f32
    assert mb.compute["CPU"] == 896 * 896 * 3 * 4
    # without flash attention the 16 heads' 4096 x 4096 f32 attention scores are live at once
    no_fa = project_mmproj(p, DeviceSet(CPU, (cuda,)), MmprojOptions(flash_attn=False))
    assert no_fa.compute["CUDA0"] >= 16 * 4096 * 4096 * 4 > mb.compute["CUDA0"]


def test_device_choice_follows_llama_cpp() -> None:
    cuda = parse_device_decl("CUDA0=24GiB")
    mixed = DeviceSet(CPU, (*_rpc(2), cuda))
    assert mixed.gpus[0].name == "RPC0"  # llama.cpp's model device order puts RPC first ...
    assert mmproj_device(mixed, MmprojOptions()) == cuda  # ... clip takes the registry's first GPU
    rpc_only = DeviceSet(CPU, _rpc(2))
    assert mmproj_device(rpc_only, MmprojOptions()).name == "RPC0"  # type: ignore[union-attr]
    assert mmproj_device(rpc_only, MmprojOptions(offload=False)) is None
    assert mmproj_device(rpc_only, MmprojOptions(device="none")) is None
    assert mmproj_device(rpc_only, MmprojOptions(device="RPC1")).name == "RPC1"  # type: ignore[union-attr]
    assert mmproj_device(rpc_only, MmprojOptions(devices=("RPC1", "RPC0"))).name == "RPC1"  # type: ignore[union-attr]
    assert mmproj_device(DeviceSet(CPU, ()), MmprojOptions()) is None


@pytest.mark.parametrize("argv", [
    ["-mm", "P", "--no-mmproj-offload"], ["--mmproj", "P", "--no-mmproj-offload"],
    ["-mmu", "P", "--mmproj-offload", "--no-mmproj-offload"], ["--mmproj-url", "P", "-mmdev", "none",
                                                                "--no-mmproj-offload"],
])
def test_every_spelling_is_read(argv: list[str]) -> None:
    setup = mmproj_setup(parse_server_args(argv))
    assert setup is not None and setup.location == "P" and not setup.offload
    assert argv_mmproj_setup(tuple(argv)) == setup
    assert mmproj_setup(parse_server_args(["-c", "4096"])) is None


def test_plan_table_json_and_export_count_the_projector(files: dict[str, Path]) -> None:
    from offload_planner.core.plan_report import plan_json, plan_text

    devices = DeviceSet(CPU, _rpc(2))
    model = open_model(files["text"])
    base = ["--rpc", "127.0.0.1:5000,127.0.0.1:5001", "-c", "2048", "-fa", "off"]
    mm = ["-mm", str(files["gemma3-448"]), "--no-mmproj-offload"]
    without = analyse_command(model, devices, parse_server_args(base))
    with_mm = analyse_command(model, devices, parse_server_args(base + mm))
    setup = mmproj_setup(parse_server_args(mm))
    assert setup is not None
    mb = project_mmproj(read_projector(setup.location), devices, setup.options(False))
    assert mb.device == "CPU"
    for a, b in zip(without.projection.devices, with_mm.projection.devices, strict=True):
        assert b.total() - a.total() == mb.total(a.device.name)
        assert b.total(KIND) == mb.total(a.device.name)
    text = plan_text(with_mm.projection, warnings=[], errors=[], command="x")
    assert text.count("+mmproj") == 1  # one row, under the CPU
    cpu_json = plan_json(with_mm.projection, warnings=[], errors=[], command=[])["devices"][-1]
    assert cpu_json["mmproj_bytes"] == mb.total("CPU")
    assert "mmproj_bytes" not in json.dumps(plan_json(without.projection, warnings=[], errors=[], command=[]))
    # the plan (window, search, plan files) projects it from its kept flags; export writes them
    plan = plan_from_args(model, devices, parse_server_args(base + mm))
    assert plan.projection().device("CPU").total(KIND) == mb.total("CPU")
    cmd = plan_command(plan)
    assert cmd[cmd.index("-mm") + 1] == str(files["gemma3-448"]) and "--no-mmproj-offload" in cmd


def test_a_projector_set_only_in_the_environment_is_one_projection_everywhere(files: dict[str, Path]) -> None:
    """``LLAMA_ARG_MMPROJ`` (with its offload setting in ``LLAMA_ARG_MMPROJ_OFFLOAD``, ``-fa auto``):
    the plan the window keeps and the ``plan`` command project the same projector as the same
    command given on the command line, and the exported command leaves it to the environment."""
    from offload_planner.core.analysis import command_projection

    devices = DeviceSet(CPU, (parse_device_decl("CUDA0=24GiB"),))
    model = open_model(files["text"])
    base = ["-ngl", "99", "-c", "2048", "-fa", "auto"]
    env = {"LLAMA_ARG_MMPROJ": str(files["gemma3-448"]), "LLAMA_ARG_MMPROJ_OFFLOAD": "0"}
    on_argv = parse_server_args([*base, "-mm", str(files["gemma3-448"]), "--no-mmproj-offload"])
    in_env = parse_server_args(base, env=env)
    assert mmproj_setup(in_env) == mmproj_setup(on_argv) is not None
    mb = project_mmproj(read_projector(files["gemma3-448"]), devices, MmprojOptions(offload=False))
    assert mb.device == "CPU" and mb.total("CPU") > 0  # not offloaded: weights and compute on the CPU

    def rows(projection: object) -> list[tuple[str, int, str]]:
        return [(b.device, b.bytes, b.why) for b in projection.buffers() if b.kind == KIND]  # type: ignore[attr-defined]

    want = rows(command_projection(plan_from_args(model, devices, on_argv))[0])
    assert sum(b for _, b, _ in want) == mb.total("CPU")
    plan = plan_from_args(model, devices, in_env)
    assert rows(plan.projection()) == want  # the window's path (Plan -> Projection)
    assert rows(command_projection(plan)[0]) == want  # the command's path
    assert rows(analyse_command(model, devices, in_env).projection) == want
    cmd = plan_command(plan)
    assert "-mm" not in cmd and "--mmproj" not in cmd  # the environment keeps it


def test_fit_targets_use_the_backend_registry_index(files: dict[str, Path]) -> None:
    """The server adds the projector to fit_params_target[registry index]: registry = local GPUs,
    CPU, RPC servers; the fit reads it by model device index (RPC first)."""
    p = read_projector(files["gemma3"])
    rpc_only = DeviceSet(CPU, _rpc(2))
    mb = project_mmproj(p, rpc_only, MmprojOptions())
    assert mb.device == "RPC0"
    assert fit_targets(mb, rpc_only, [GiB, GiB]) == [
        GiB + mb.compute["CPU"], GiB + p.weight_bytes + mb.compute["RPC0"]]
    cuda = DeviceSet(CPU, (parse_device_decl("CUDA0=24GiB"), parse_device_decl("CUDA1=24GiB")))
    mb = project_mmproj(p, cuda, MmprojOptions())
    assert fit_targets(mb, cuda, [GiB, GiB]) == [
        GiB + p.weight_bytes + mb.compute["CUDA0"], GiB]  # the CPU's index (2) is past the GPUs
    model = open_model(files["text"])
    parsed = parse_server_args(["--rpc", "127.0.0.1:5000,127.0.0.1:5001", "-mm", str(files["gemma3"])])
    res = analyse_command(model, rpc_only, parsed)
    fitted = fit_for_args(model, rpc_only, parsed, res.plan.placement_options, res.plan.context,
                          free_bytes=[8 * GiB, 8 * GiB])
    assert fitted is not None
    assert any(line.endswith("target of 1026") for line in fitted.log)  # RPC1: 1024 + 2.8 MiB


def test_fastest_plan_leaves_room_for_the_projector(files: dict[str, Path]) -> None:
    from offload_planner.core.speed.candidate import DEFAULT_MARGIN
    from offload_planner.core.speed.fastest import fastest_plan
    from offload_planner.core.speed.hardware import hardware_for

    qwen = open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))
    ds = DeviceSet(parse_device_decl("CPU=256GiB,ram=4xDDR5-5600"),
                   (parse_device_decl("CUDA0=12GiB,bw=936GB/s,pcie=4x16,tflops=142"),))
    hw = hardware_for(ds, threads=16)
    base = ["-c", "16384"]
    plain = fastest_plan(qwen, ds, base, hw, goal="tg", prompt=4096).best
    mm = fastest_plan(qwen, ds, [*base, "-mm", str(files["gemma-3-27b-mmproj-f16"])], hw, goal="tg",
                      prompt=4096).best
    assert plain is not None and mm is not None
    proj = mm.plan.projection()
    gpu = proj.device("CUDA0")
    assert gpu.total(KIND) > 800 * MiB
    assert gpu.resident() + DEFAULT_MARGIN <= 12 * GiB
    assert gpu.total("model") < plain.plan.projection().device("CUDA0").total("model")


@pytest.mark.parametrize("bad", ["missing", "text", "truncated"])
def test_bad_projector_is_one_clear_error(bad: str, files: dict[str, Path], tmp_path: Path) -> None:
    path = {"missing": tmp_path / "nope.gguf", "text": files["text"],
            "truncated": tmp_path / "cut.gguf"}[bad]
    if bad == "truncated":
        path.write_bytes(files["gemma3"].read_bytes()[:200])
    with pytest.raises(GGUFError) as e:
        read_projector(path)
    assert str(path) in str(e.value)


def test_cuda_pads_quantized_rows_of_the_projector(files: dict[str, Path]) -> None:
    """ggml-cuda's get_alloc_size adds (512 - ne0 % 512) elements to a quantized tensor; the
    buffer aligns each tensor to 128 bytes (RPC/CPU: 32, no padding)."""
    p = read_projector(files["gemma3-448"])
    cuda = parse_device_decl("CUDA0=24GiB")

    def pad(n: int, a: int) -> int:
        return -(-n // a) * a

    q8 = [t for t in p.tensors if t.type.name == "q8_0"]
    assert q8 and all(t.shape[0] % 512 for t in q8)
    expected = sum(pad(t.nbytes + ((512 - t.shape[0] % 512) // 32 * 34 if t.type.name == "q8_0" else 0), 128)
                   for t in p.tensors)
    assert project_mmproj(p, DeviceSet(CPU, (cuda,)), MmprojOptions()).weights == expected
    assert project_mmproj(p, DeviceSet(CPU, _rpc(1)), MmprojOptions()).weights == sum(
        pad(t.nbytes, 32) for t in p.tensors)


def test_qwen25vl_shapes(files: dict[str, Path]) -> None:
    """Qwen2.5-VL-7B: 1280 wide, 32 blocks of 4 x 1280^2 attention + 3 x 1280 x 3420 SwiGLU, a
    5120^2 + 5120 x 3584 merger, two 14 x 14 x 3 x 1280 patch kernels (f16), f32 norms and biases."""
    p = read_projector(files["qwen2.5-vl-7b-mmproj-f16"])
    f16 = 32 * (4 * 1280 * 1280 + 3 * 1280 * 3420) + 5120 * 5120 + 5120 * 3584 + 2 * 14 * 14 * 3 * 1280
    f32 = 32 * (4 * 1280 + 3420 * 2 + 1280 + 2 * 1280) + 5120 + 3584 + 1280
    assert p.weight_bytes == 2 * f16 + 4 * f32
    assert p.has_graph and p.warmup_size() == 46 * 14 * 2  # set_warmup_n_tokens(46*46)
    assert p.warmup_size(image_max_tokens=1024) == 32 * 14 * 2
    mb = project_mmproj(p, DeviceSet(CPU, (parse_device_decl("CUDA0=24GiB"),)), MmprojOptions())
    # the CPU holds the graph inputs: the image, 4 positions per patch, the two window index
    # vectors (one per merged 2x2 patch) and the f32 window mask over 92 x 92 = 8464 patches
    inputs = [1288 * 1288 * 3 * 4, 8464 * 4 * 4, 2116 * 4, 8464 * 8464 * 4, 2116 * 4]
    assert mb.device == "CUDA0" and not mb.why
    assert mb.compute["CPU"] == sum(-(-n // 32) * 32 for n in inputs)


def test_other_projector_types_get_weights_and_a_note(files: dict[str, Path], tmp_path: Path) -> None:
    from dataclasses import replace

    path = write_mmproj(replace(SMALL_MMPROJ["gemma3"], proj_type="idefics3"), tmp_path / "i3.gguf")
    devices = DeviceSet(CPU, _rpc(1))
    res = analyse_command(open_model(files["text"]), devices,
                     parse_server_args(["--rpc", "127.0.0.1:5000", "-mm", str(path)]))
    mm = [b for b in res.projection.buffers() if b.kind == KIND]
    assert [(b.device, b.why.split(":")[0]) for b in mm] == [("RPC0", "projector weights")]
    assert any("no compute graph for projector type 'idefics3'" in n for n in res.command_notes)


def test_plan_file_keeps_the_projector(files: dict[str, Path], tmp_path: Path) -> None:
    from offload_planner.core.plan_file import PlanFile, load_plan, save_plan

    devices = DeviceSet(CPU, _rpc(1))
    model = open_model(files["text"])
    plan = plan_from_args(model, devices, parse_server_args(
        ["--rpc", "127.0.0.1:5000", "-mm", str(files["gemma3"]), "-mmdev", "none"]))
    save_plan(tmp_path / "p.plan.json", PlanFile.of(plan))
    loaded, _ = load_plan(tmp_path / "p.plan.json").to_plan(model)
    before = [(b.device, b.bytes) for b in plan.projection().buffers() if b.kind == KIND]
    after = [(b.device, b.bytes) for b in loaded.projection().buffers() if b.kind == KIND]
    assert before == after and {d for d, _ in after} == {"CPU"}


def test_environment_variables_are_read() -> None:
    parsed = parse_server_args(["-c", "2048"], env={
        "LLAMA_ARG_MMPROJ": "/p.gguf", "LLAMA_ARG_MMPROJ_OFFLOAD": "0", "MTMD_BACKEND_DEVICE": "RPC1"})
    setup = mmproj_setup(parsed)
    assert setup is not None
    assert (setup.location, setup.offload, setup.device) == ("/p.gguf", False, "RPC1")


def test_mmproj_url_is_read_over_http_ranges(files: dict[str, Path]) -> None:
    """``-mmu URL``: the server downloads it; the planner reads only its header over HTTP."""
    from tests.support.http_range_server import RangeServer

    with RangeServer(files["gemma3"].parent) as srv:
        url = srv.url(files["gemma3"].name)
        devices = DeviceSet(CPU, _rpc(1))
        res = analyse_command(open_model(files["text"]), devices,
                         parse_server_args(["--rpc", "127.0.0.1:5000", "-mmu", url]))
        sent = sum(r.bytes_sent for r in srv.log)
    local = project_mmproj(read_projector(files["gemma3"]), devices, MmprojOptions())
    mm = [(b.device, b.bytes) for b in res.projection.buffers() if b.kind == KIND]
    assert mm == [("RPC0", local.weights), *local.compute.items()]
    assert 0 < sent < os.path.getsize(files["gemma3"])  # the header (one 1 MiB range), not all


def test_audio_projector_counts_its_weights(files: dict[str, Path], tmp_path: Path) -> None:
    """An audio-only mmproj (e.g. Ultravox): clip.cpp loads it as an audio encoder; the planner
    counts its weights on the projector's device and says its compute is not projected."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    path = tmp_path / "audio.gguf"
    w = GGUFWriter(path, "clip")
    w.add_string("clip.projector_type", "ultravox")
    w.add_bool("clip.has_audio_encoder", True)
    for key, v in (("embedding_length", 64), ("attention.head_count", 2), ("feed_forward_length", 128),
                   ("block_count", 1), ("projection_dim", 256)):
        w.add_uint32(f"clip.audio.{key}", v)
    w.add_uint32("clip.audio.num_mel_bins", 128)
    w.add_tensor_info("a.blk.0.attn_q.weight", (64, 64), np.dtype(np.float32), 64 * 64 * 2,
                      raw_dtype=GGMLQuantizationType.F16)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    p = read_projector(path)
    assert (p.proj_type, p.audio, p.weight_bytes) == ("audio:ultravox", True, 64 * 64 * 2)
    res = analyse_command(open_model(files["text"]), DeviceSet(CPU, _rpc(1)),
                     parse_server_args(["--rpc", "127.0.0.1:5000", "-mm", str(path)]))
    assert [(b.device, b.bytes) for b in res.projection.buffers() if b.kind == KIND] == [("RPC0", 8192)]
    assert any("no compute graph for projector type 'audio:ultravox'" in n for n in res.command_notes)


def test_other_dialects_say_the_projector_is_not_projected(files: dict[str, Path]) -> None:
    parsed = parse_server_args(["--mmproj", str(files["gemma3"]), "-c", "2048"], dialect="ik_llama.cpp")
    assert not parsed.errors
    res = analyse_command(open_model(files["text"]), DeviceSet(CPU, ()), parsed, "ik_llama.cpp")
    assert not [b for b in res.projection.buffers() if b.kind == KIND]
    assert any(n.startswith("--mmproj: the projector's memory is projected for") for n in res.command_notes)
