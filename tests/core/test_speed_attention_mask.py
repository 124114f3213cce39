"""A prompt's attention FLOPs with and without flash attention (Qwen3-30B-A3B's header, on the CPU and
on a GPU): without it llama.cpp multiplies every query by every cell of the cache's view and applies the
causal mask after the products (llama-graph.cpp ``build_attn_mha``: ``kq = ggml_mul_mat(k, q)``, then
``ggml_soft_max_ext(kq, kq_mask, ...)``, then ``kqv``), so a micro-batch of ``u`` tokens after ``start``
cached ones costs ``start + u`` cells a query; the flash-attention kernels skip the masked cells (the
CPU's per cell, CUDA's per tile): ``start + u / 2`` on average.  The old estimate counted the causal
half for both."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.efficiency import DEFAULT
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.speed.pp import pp_time

RES = Path(__file__).resolve().parents[2] / "resources"


@pytest.fixture(scope="module")
def qwen() -> Model:
    return open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))


def _attention_seconds(model: Model, gpus: tuple[str, ...], fa: str, prompt: int,
                       depth: int) -> dict[str, float]:
    ds = DeviceSet(parse_device_decl("CPU=512GiB,ram=8xDDR5-4800"), tuple(parse_device_decl(g) for g in gpus))
    argv = ["-c", "16384", "-np", "1", "-ub", "512", "-fa", fa, "-ngl", "99" if gpus else "0"]
    plan = plan_from_args(model, ds, parse_server_args(argv))
    parts = pp_time(plan, plan.placement(), hardware_for(ds), DEFAULT, prompt, 512, depth=depth)
    return dict(parts.attn_s)


@pytest.mark.parametrize("gpus", [(), ("CUDA0=rtx4090",)])
def test_without_flash_attention_a_query_multiplies_every_cell(qwen: Model, gpus: tuple[str, ...]) -> None:
    dev = "CUDA0" if gpus else "CPU"
    on = _attention_seconds(qwen, gpus, "on", 512, 0)[dev]
    off = _attention_seconds(qwen, gpus, "off", 512, 0)[dev]
    assert off == pytest.approx(2 * on)  # one micro-batch from an empty cache: 512 cells, not 256
    # after 3584 cached tokens: 3584 + 512 cells against 3584 + 256
    on_d = _attention_seconds(qwen, gpus, "on", 512, 3584)[dev]
    off_d = _attention_seconds(qwen, gpus, "off", 512, 3584)[dev]
    assert off_d / on_d == pytest.approx(4096 / 3840)
