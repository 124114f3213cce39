"""A prompt's micro-batches multiply the output matrix and the last layer's FFN for the output rows
alone (llama.cpp's model graphs cut the rows to ``inp_out_ids`` after the last layer's attention;
a prompt asks for its last token's logits): the prompt-processing estimate leaves them out, the
generation estimate keeps them; on real GGUF headers written by the project's synth."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.estimate import estimate
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.speed.pp import _work
from offload_planner.core.synth import SMALL_MODELS, write_model

DEVICES = DeviceSet(parse_device_decl("CPU=64GiB,bw=100GB/s,cores=8"), ())


def _plan(tmp_path: Path, name: str, n_vocab: int, arch: str = "llama") -> tuple[Model, Plan]:
    base = SMALL_MODELS[arch]
    tok = replace(base.tokenizer, n_vocab=n_vocab, n_merges=min(base.tokenizer.n_merges, n_vocab - 64))
    [path] = write_model(replace(base, tokenizer=tok), tmp_path / f"{name}.gguf", header_only=True)
    model = open_model(str(path))
    return model, plan_from_args(model, DEVICES, parse_server_args(["-c", "2048"]), "llama.cpp")


def test_the_output_matrix_costs_a_prompt_nothing_and_a_token_its_bytes(tmp_path: Path) -> None:
    """Two models that differ only in their vocabulary (the output matrix 16x the rows): the same
    prompt time, a slower generated token."""
    small = estimate(_plan(tmp_path, "v1k", 1024)[1], hardware_for(DEVICES), prompt=512)
    big = estimate(_plan(tmp_path, "v16k", 16384)[1], hardware_for(DEVICES), prompt=512)
    assert big.pp_tps == pytest.approx(small.pp_tps, rel=1e-9)
    assert big.tg_tps < 0.95 * small.tg_tps


@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
def test_a_prompt_runs_every_layer_but_the_last_ones_ffn(tmp_path: Path, arch: str) -> None:
    """The CPU's matrix elements a micro-batch multiplies: every 2-D weight but the token embedding
    (a row lookup), the output matrix (or the tied embedding's output copy) and the last layer's FFN
    (router, experts, shared expert, dense FFN); the last layer's attention stays."""
    model, plan = _plan(tmp_path, arch, 1024, arch)
    last = model.summary.n_layer - model.summary.n_nextn - 1
    want = sum(t.n_elements for t in model.tensors if len(t.shape) >= 2
               and not t.name.startswith(("token_embd.", "output.", f"blk.{last}.ffn_")))
    assert any(t.name.startswith(f"blk.{last}.attn_") for t in model.tensors)
    work = _work(plan.placement(), plan.dialect, last_layer=last)
    assert sum(work["CPU"].el) == want
