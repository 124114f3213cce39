"""Fitting a Mac's GPU when Metal maps the model file (mmap): `fit`'s search, the `--fit` port's report.

With mmap the pinned build wraps the file span from the first to the last of MTL0's tensors in one
``MTL0_Mapped`` buffer (tests/test_cli_metal_mapped.py), so the CPU's tensors lying between MTL0's count
on MTL0 too: ``--cpu-moe`` keeps attention of every layer and the output on MTL0, so its span is the
file's tensor data from layer 0 to the output, experts included. llama.cpp's ``--fit`` measures its dry
runs without mmap (``mparams_copy.load_mode = LLAMA_LOAD_MODE_NONE``, common/fit.cpp:58-59 of the pinned
build), where MTL0 holds only its tensors: its fitted command fits as measured and is over as loaded.

The model: the project's header-only Qwen3-30B-A3B Q4_K_M (token_embd first, then blk.0 ... blk.47, the
output norm and output.weight last). Sizes below are worked out from the tensors' offsets as gguf-py reads
them, not from the planner's reader.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.support.gguf_extents import Extents, gguf_py_extents
from tests.support.gguf_extents import padded as _padded
from tests.support.gguf_extents import span as _span

ROOT = Path(__file__).resolve().parents[1]
QWEN = ROOT / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf"
GIB = 1 << 30
MARGIN = 1 << 30  # the default margin fit keeps on every GPU
MTL0 = ["--device", "MTL0=m2max,12GiB", "--device", "CPU=32GiB,bw=100GB/s"]
EXPERTS = re.compile(r"blk\.\d+\.ffn_(up|gate|down)_exps\.weight")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "gui"), "QT_QPA_PLATFORM": "offscreen"}
    return subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                          timeout=600, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory) -> Extents:
    """Each tensor's first byte and end in the file, as gguf-py reads them."""
    return gguf_py_extents(Path(QWEN), tmp_path_factory.mktemp("q30"), 32 << 30)


@pytest.fixture(scope="module")
def fit_json() -> dict[str, Any]:
    r = _cli("fit", str(QWEN), "--no-detect", *MTL0, "--json", "--", "-c", "8192")
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_the_search_fits_a_12_gib_mac_without_mmap(fit_json: dict[str, Any],
                                                   ext: dict[str, tuple[int, int]]) -> None:
    """--cpu-moe with mmap maps MTL0's span from blk.0's first tensor to output.weight's end: every
    expert too, 17.11 GiB on a 12 GiB GPU. Before, the search said nothing fits; now its candidates
    without mmap (-lm none) copy only MTL0's tensors, and the best of them fits."""
    gpu_cpu_moe = [n for n in ext if n != "token_embd.weight" and not EXPERTS.fullmatch(n)]
    span = _span(ext, gpu_cpu_moe)
    assert span == ext["output.weight"][1] - ext["blk.0.attn_norm.weight"][0]
    assert f"{span / GIB:.2f}" == "17.11" and span > 12 * GIB - MARGIN
    rows = {c["label"]: c for c in fit_json["candidates"]}
    assert rows["--cpu-moe"]["over"] == ["MTL0"]
    best = fit_json["best"]
    assert best is not None and "-lm none" in best and rows[best]["fits"] and rows[best]["verified"]
    plan = fit_json["plan"]
    assert plan["command"][-4:-2] == ["-lm", "none"]
    on_gpu = sorted(n for n, d in plan["tensors"].items() if d == "MTL0")
    mtl0 = next(d for d in plan["devices"] if d["name"] == "MTL0")
    # a plain MTL0 buffer of the tensors' padded sizes, under the capacity less the margin
    assert [(b["name"], b["bytes"]) for b in mtl0["buffers"] if b["kind"] == "model"] == [
        ("MTL0", _padded(ext, on_gpu))]
    assert mtl0["total_bytes"] <= 12 * GIB - MARGIN
    assert any(EXPERTS.fullmatch(n) for n in on_gpu)  # experts beside the attention the span held
    assert any("candidates with -lm none copy only the GPU's tensors" in n for n in fit_json["notes"])


def test_the_top_layers_with_mmap_are_a_candidate(fit_json: dict[str, Any],
                                                  ext: dict[str, tuple[int, int]]) -> None:
    """The other way to shrink the span: the most layers from the top (-ngl N, mmap kept). The last N
    layers and the output lie together at the file's end, so MTL0's mapped span is exactly its tensors;
    N is the largest that fits (N + 1 is over)."""
    top = [c for c in fit_json["candidates"] if re.fullmatch(r"-ngl \d+ \(mmap\)", c["label"])]
    assert len(top) == 1 and top[0]["fits"]
    n = int(top[0]["label"].split()[1])
    layers = [t for t in ext if (m := re.match(r"blk\.(\d+)\.", t)) and int(m[1]) >= 48 - (n - 1)]
    gpu = [*layers, "output_norm.weight", "output.weight"]  # -ngl counts the output layer as one
    assert _span(ext, gpu) == sum(ext[t][1] - ext[t][0] for t in gpu)  # contiguous: no gap
    plans = {}
    for k in (n, n + 1):
        r = _cli("plan", str(QWEN), "--no-detect", *MTL0, "--json", "--", "-c", "8192", "-ngl", str(k),
                 "-fit", "off")
        plans[k] = json.loads(r.stdout)
    mtl0 = next(d for d in plans[n]["devices"] if d["name"] == "MTL0")
    assert sorted(t for t, d in plans[n]["tensors"].items() if d == "MTL0") == sorted(gpu)
    assert [(b["name"], b["bytes"]) for b in mtl0["buffers"] if b["kind"] == "model"] == [
        ("MTL0_Mapped", _span(ext, gpu))]
    assert mtl0["total_bytes"] <= 12 * GIB - MARGIN
    over = next(d for d in plans[n + 1]["devices"] if d["name"] == "MTL0")
    assert over["total_bytes"] > 12 * GIB - MARGIN


def test_fits_row_for_llama_cpps_fit_says_why_it_is_over(fit_json: dict[str, Any]) -> None:
    rows = {c["label"]: c for c in fit_json["candidates"]}
    assert rows["llama.cpp --fit"]["over"] == ["MTL0"]
    assert any(n.startswith("llama.cpp --fit: over with mmap: its dry runs load without mmap "
                            "(common/fit.cpp:58)") and "MTL0's 17.11 GiB file span" in n
               for n in fit_json["notes"])


def test_plan_says_the_fitted_command_is_over_on_mtl0(ext: dict[str, tuple[int, int]]) -> None:
    """The pinned build's --fit (on by default) moves the experts of layers 27-47 and blk.27's router to
    the CPU, which fits without mmap; the server loads with mmap and MTL0 maps the span of the rest from
    blk.0 to the output. The plan says so and exits 3 (over), where it took the fit's word before."""
    r = _cli("plan", str(QWEN), "--no-detect", *MTL0, "--", "-c", "8192")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "-ot 'blk\\.(2[7-9]|3[0-9]|4[0-7])\\.ffn_(up|gate|down|gate_up)_exps=CPU," \
           "^blk\\.27\\.ffn_gate_inp\\.weight$=CPU'" in r.stdout  # the fitted command
    cpu = {n for n in ext if (m := re.match(r"blk\.(\d+)\.ffn_(up|gate|down)_exps", n)) and int(m[1]) >= 27}
    gpu = [n for n in ext if n not in cpu | {"token_embd.weight", "blk.27.ffn_gate_inp.weight"}]
    span, own = _span(ext, gpu), sum(ext[n][1] - ext[n][0] for n in gpu)
    assert (f"{span / GIB:.2f}", f"{own / GIB:.2f}") == ("17.11", "9.94")
    assert ("note: --fit's command is still over with mmap: llama.cpp's fit measures its dry runs without "
            "mmap (common/fit.cpp:58), where a Metal GPU holds only its tensors, but the server loads with "
            f"mmap and MTL0 maps the {span / GIB:.2f} GiB file span of its {own / GIB:.2f} GiB of tensors"
            ) in r.stdout
    assert "note: over capacity: MTL0 (exit status 3)" in r.stdout
    # -lm none: the server loads as the fit measured; no such note, and the fit's word stands
    r = _cli("plan", str(QWEN), "--no-detect", *MTL0, "--", "-c", "8192", "-lm", "none")
    assert r.returncode == 0 and "still over with mmap" not in r.stdout, r.stdout


FITTED_OT = (r"blk\.(2[7-9]|3[0-9]|4[0-7])\.ffn_(up|gate|down|gate_up)_exps=CPU,"
             r"^blk\.27\.ffn_gate_inp\.weight$=CPU")


def test_a_macs_plan_says_which_bytes_it_counts_twice(ext: dict[str, tuple[int, int]]) -> None:
    """Unified memory: the CPU's mapped tensors (the experts of layers 27-47 and blk.27's router, -nr: no
    repacked copy) lie inside MTL0's span (blk.0 to output.weight), so both rows count them: one copy of
    the file's pages in the Mac's RAM. The CPU's note no longer says the span's other tensors are never
    read into RAM (MTL0's are: Metal maps them); the unified note gives the bytes counted twice and what
    both devices take together (MTL0's total, the CPU's with its mapped tensors, less the shared)."""
    args = ("plan", str(QWEN), "--no-detect", *MTL0)
    server = ("--", "-c", "8192", "-ngl", "999", "-ot", FITTED_OT, "-fa", "on", "-fit", "off", "-nr")
    plan = json.loads(_cli(*args, "--json", *server).stdout)
    cpu = sorted({n for n, d in plan["tensors"].items() if d == "CPU"})
    gpu = sorted({n.removesuffix(" (output copy)") for n, d in plan["tensors"].items() if d == "MTL0"})
    lo, hi = min(ext[n][0] for n in gpu), max(ext[n][1] for n in gpu)
    shared = sum(ext[n][1] - ext[n][0] for n in cpu if ext[n][0] >= lo and ext[n][1] <= hi)
    assert shared == sum(ext[n][1] - ext[n][0] for n in cpu if n != "token_embd.weight")  # token_embd: before
    dev = {d["name"]: d for d in plan["devices"]}
    cpu_span = next(b["bytes"] for b in dev["CPU"]["buffers"] if b["name"] == "CPU_Mapped")
    cpu_counted = dev["CPU"]["total_bytes"] - cpu_span + sum(ext[n][1] - ext[n][0] for n in cpu)
    held = dev["MTL0"]["total_bytes"] + cpu_counted - shared
    text = _cli(*args, *server).stdout
    assert (f"unified memory: {shared / GIB:.2f} GiB of the CPU's mapped tensors lie inside the mapped "
            "span of MTL0 and are counted on both rows") in text
    assert f"so the devices together take {held / GIB:.2f} GiB of the CPU's 32.00 GiB" in text
    assert "never read into RAM" not in text
    assert ("the span includes other devices' tensors, which the CPU does not read: MTL0's count in its "
            "mapped span (Metal maps them into the GPU's working set)") in text
    # without mmap nothing is mapped: no such note
    assert "mapped tensors lie inside" not in _cli(*args, *server, "-lm", "none").stdout


def test_a_mac_whose_ram_cannot_hold_the_model_fits_nothing(ext: dict[str, tuple[int, int]]) -> None:
    """On a Mac MTL0's memory is a share of the RAM (Metal's recommendedMaxWorkingSetSize): whatever the
    placement, MTL0 and the CPU together hold every tensor once (with -lm none each a copy; with mmap the
    CPU's mapped tensors inside MTL0's span are the same pages, counted once). Qwen3-30B's 17.28 GiB of
    tensors do not fit 16 GiB of RAM: before, the search counted the CPU's 8 GiB alone and took a plan."""
    assert f"{sum(e - o for o, e in ext.values()) / GIB:.2f}" == "17.28"
    r = _cli("fit", str(QWEN), "--no-detect", "--device", "MTL0=m2max,12GiB",
             "--device", "CPU=16GiB,bw=100GB/s", "--", "-c", "8192")
    assert r.returncode == 1, r.stdout
    m = re.search(r"nothing fits these devices: CPU \(RAM\) over by [\d.]+ GiB \(([\d.]+) GiB projected, the "
                  r"Metal GPU's share of the same memory included > 16\.0 GiB\)", r.stdout + r.stderr)
    assert m and float(m[1]) > 17.28, r.stdout + r.stderr


def test_a_macs_plan_over_its_ram_exits_over() -> None:
    """Without mmap MTL0 holds copies of its tensors (10.91 GiB, under its 12 GiB) and the CPU its own
    (7.36 GiB, under 16 GiB): each row fits, but on a Mac both are the same 16 GiB of RAM. The plan says
    what they take together, by how much that is over, and exits 3 (before: 0, every row fit)."""
    args = ("plan", str(QWEN), "--no-detect", "--device", "MTL0=m2max,12GiB",
            "--device", "CPU=16GiB,bw=100GB/s")
    server = ("--", "-c", "8192", "-lm", "none", "-fit", "off", "-ot", FITTED_OT.split(",")[0])
    plan = json.loads(_cli(*args, "--json", *server).stdout)
    held = sum(d["total_bytes"] for d in plan["devices"])  # no mmap: every buffer's bytes are taken
    assert all(d["total_bytes"] <= d["capacity_bytes"] for d in plan["devices"]) and held > 16 * GIB
    r = _cli(*args, *server)
    assert r.returncode == 3, r.stdout
    assert (f"so the devices together take {held / GIB:.2f} GiB, more than the CPU's 16.00 GiB by "
            f"{(held - 16 * GIB) / GIB:.2f} GiB") in r.stdout
    assert "note: over capacity: CPU (exit status 3)" in r.stdout
