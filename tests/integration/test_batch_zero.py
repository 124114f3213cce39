"""``-b 0`` as the builds take it: the pinned llama-server aborts while it creates the context, ik's
library raises ``n_batch`` to its KQ mask padding (16) and runs, and both refuse ``-b 0 -ub 0``.
The planner hung on ``-b 0`` (the speed estimate walked the prompt in micro-batches of 0 tokens);
now it refuses what the server refuses and projects what ik runs, buffer for buffer."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.ik_cases import ik_plan, require_ik
from tests.support.ik_context import measure
from tests.support.procs import ProcessFailed
from tests.support.server_buffers import mib, server_output

pytestmark = pytest.mark.integration


def test_the_pinned_server_aborts_on_b_0(llama_server: Path, small_models: dict[str, Path],
                                        tmp_path: Path) -> None:
    """What the planner's refusal of ``-b 0`` says, on the real server."""
    with pytest.raises(ProcessFailed) as failed:
        server_output(llama_server, ["-m", str(small_models["llama"]), "-c", "512", "-np", "1", "-t", "1",
                                     "-b", "0"], tmp_path / "server.log", timeout=60)
    assert "GGML_ASSERT(n_outputs >= 1) failed" in failed.value.output


def test_ik_raises_b_0_and_small_batches_to_its_mask_padding(small_models: dict[str, Path]) -> None:
    """ik's ``llama_init_from_model``: "n_batch is less than GGML_KQ_MASK_PAD - increasing to 16", so
    ``-b 0`` and ``-b 3`` run with a batch and micro-batch of 16; the compute and output buffers the
    planner projects for them equal ik's."""
    require_ik()
    settings = [{"n_ctx": 1100, "n_batch": b, "n_ubatch": 512, "flash_attn": True} for b in (0, 3)]
    settings.append({"n_ctx": 1100, "n_batch": 0, "n_ubatch": 0, "flash_attn": True})
    report = measure(small_models["llama"], 0, settings)
    for ctx, b in zip(report.contexts[:2], (0, 3), strict=True):
        assert ctx.created and "llama_init_from_model: n_batch       = 16" in ctx.lines, ctx.lines
        projection, errors = ik_plan(small_models["llama"], f"-c 1100 -b {b}")
        assert errors == []
        assert (projection.context.n_batch, projection.context.n_ubatch) == (16, 16)
        cpu = next(d for d in projection.devices if d.device.name == "CPU")
        assert mib(cpu.total("compute")) == ctx.compute_mib["CPU"]
        assert mib(cpu.total("output")) == ctx.output_mib["CPU"]
    both = report.contexts[2]
    assert not both.created and any("cannot both be zero" in x for x in both.lines)
