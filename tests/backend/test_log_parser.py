"""The log parser over real llama-server output (captured from the pinned build with -lv 4 and two
ggml-rpc-servers) and over ik_llama.cpp / older mainline line formats from their sources."""

from __future__ import annotations

from pathlib import Path

from offload_planner.backend.log_parser import device_of_buffer, parse_log

DATA = Path(__file__).parent / "data"
RPC = {"127.0.0.1:50071": "RPC0", "127.0.0.1:50072": "RPC1"}


def test_real_rpc_log_buffers_per_device() -> None:
    rep = parse_log((DATA / "llama-server-rpc2-qwen3moe.log").read_text().splitlines())
    assert rep.by_device(RPC) == {
        "CPU": {"model": 0.31, "output": 0.02, "compute": 21.07},
        "RPC0": {"model": 3.02, "kv": 6.0, "compute": 27.05},
        "RPC1": {"model": 1.41, "kv": 2.0, "compute": 19.54},
    }
    assert rep.listening_url == "http://127.0.0.1:50080"
    assert rep.n_tensors == 50 and rep.errors == []
    assert rep.info["n_layer"] == "4" and rep.info["n_expert"] == "8" and rep.info["n_vocab"] == "1536"


def test_rpc_buffers_are_named_after_the_first_rpc_backend() -> None:
    # Every RPC buffer is logged as RPC0[endpoint]; the endpoint tells the device.
    assert device_of_buffer("RPC0[127.0.0.1:50072]", RPC) == "RPC1"
    assert device_of_buffer("CUDA_Host") == "CPU"
    assert device_of_buffer("CUDA1") == "CUDA1"


def test_ik_and_older_mainline_formats() -> None:
    lines = [
        "llm_load_tensors:        CPU buffer size =  1234.50 MiB",
        "llm_load_tensors:      CUDA0 buffer size = 20000.00 MiB",
        "llama_kv_cache_init:      CUDA0 KV buffer size =  1088.00 MiB",
        "llama_init_from_model:  CUDA_Host  output buffer size =     0.49 MiB",
        "llama_init_from_model:      CUDA0 compute buffer size =  3423.00 MiB",
        "llama_new_context_with_model:  CUDA_Host compute buffer size =    78.01 MiB",
        "llama_memory_recurrent:        CPU RS buffer size =     8.00 MiB",
        'INFO [                    main] HTTP server listening | hostname="127.0.0.1" port="8080"',
    ]
    rep = parse_log(lines)
    assert rep.by_device() == {
        "CPU": {"model": 1234.5, "output": 0.49, "compute": 78.01, "rs": 8.0},
        "CUDA0": {"model": 20000.0, "kv": 1088.0, "compute": 3423.0},
    }
    assert rep.listening_url == "http://127.0.0.1:8080"


def test_failures_are_collected() -> None:
    lines = [
        "0.00.100.000 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 24000.00 MiB on device 0:"
        " cudaMalloc failed: out of memory",
        "0.00.100.001 E llama_model_load: error loading model: unable to allocate CUDA0 buffer",
        "0.00.100.002 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)",
    ]
    rep = parse_log(lines)
    assert len(rep.errors) == 2 and "out of memory" in rep.errors[0]


def test_the_pinned_builds_metal_buffers_count_on_their_device() -> None:
    """The pinned build logs mmap'd Metal weights as ``MTL0_Mapped`` (ggml/src/ggml-metal/ggml-metal.cpp:462,
    llama-model.cpp:1856) and a GPU without unified memory's as ``MTL0_Private`` (ggml-metal.cpp:384): both
    are device MTL0's, not devices of their own (lines as a public M1 Max log of such a build prints them)."""
    rep = parse_log([
        "load_tensors:   CPU_Mapped model buffer size =   304.28 MiB",
        "load_tensors:  MTL0_Mapped model buffer size =  2375.91 MiB",
        "llama_kv_cache:       MTL0 KV buffer size =   288.00 MiB",
        "sched_reserve:       MTL0 compute buffer size =   301.75 MiB",
        "load_tensors: MTL1_Private model buffer size =    10.00 MiB",
    ])
    got = {d: dict(v) for d, v in rep.by_device().items()}
    assert got == {"CPU": {"model": 304.28}, "MTL0": {"model": 2375.91, "kv": 288.0, "compute": 301.75},
                   "MTL1": {"model": 10.0}}
    assert device_of_buffer("MTL0_Mapped") == "MTL0" and device_of_buffer("MTL0") == "MTL0"


def test_the_2025_builds_metal_mapped_buffer_counts_on_their_metal_device() -> None:
    """A 2025 build's one Metal device is ``Metal``, its mmap'd weights ``Metal_Mapped``: lines of the
    llama.cpp CI's M4 run of build 4799 (llama-embedding, bge-small, -ngl 99), verbatim from
    https://github.com/ggml-org/ci/blob/f585f5e53be641a116792152eb13fe6ccaf581ce/llama.cpp/73/3c2d6191e3bee836af72ede2dad46852816566/ggml-100-mac-m4/README.md"""
    rep = parse_log([
        "0.00.046.333 I load_tensors: Metal_Mapped model buffer size =    40.73 MiB",
        "0.00.046.335 I load_tensors:   CPU_Mapped model buffer size =    23.11 MiB",
        "0.00.065.436 I init:      Metal KV buffer size =     9.00 MiB",
        "0.00.066.643 I init:      Metal compute buffer size =    16.00 MiB",
        "0.00.066.644 I init:        CPU compute buffer size =     2.51 MiB",
    ])
    got = {d: dict(v) for d, v in rep.by_device().items()}
    assert got == {"Metal": {"model": 40.73, "kv": 9.0, "compute": 16.0},
                   "CPU": {"model": 23.11, "compute": 2.51}}
