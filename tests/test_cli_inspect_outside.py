"""`inspect`'s per-layer table printed the tensors outside the layers under its own header ("layer attn
router ...") as "token embedding    token_embd.weight q4_K     0.163": a name, a type and a size across
columns that say something else.  They are a table of their own above it, with a header and aligned
columns."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import run_cli

QWEN = str(Path(__file__).resolve().parents[1] / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")


def test_the_tensors_outside_the_layers_have_their_own_table() -> None:
    r = run_cli("inspect", QWEN)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    start = lines.index("  outside the layers tensor             type        size  (GiB)")
    assert lines[start + 1:start + 5] == [
        "  token embedding    token_embd.weight  q4_K       0.163",
        "  output norm        output_norm.weight f32        0.000",
        "  output             output.weight      q6_K       0.238",
        "",
    ]
    assert lines[start + 5].startswith("  layer        attn    router")
    assert lines[start + 6].startswith("       0      0.010")  # the layer rows right under their header
