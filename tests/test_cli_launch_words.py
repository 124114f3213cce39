"""`offload-planner launch` speaks the command's words: its -lv 4 note said 'turn off "verbose log" to
launch the command exactly as written', the Launch tab's box, which a terminal has not (the flag is
--no-verbose-log)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.cli import run_cli

from offload_planner.core.synth import SMALL_MODELS, write_model


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(SMALL_MODELS["qwen3moe"], tmp_path_factory.mktemp("launch_words") / "qwen3moe.gguf")[0]


def test_the_lv4_note_names_the_flag(llama_server: Path, small_model: Path) -> None:
    r = run_cli("launch", str(small_model), "--no-detect", "--server", str(llama_server), "--verify",
                "--quiet", "--", "-c", "256", "-fit", "off", timeout=120)
    note = [ln for ln in r.stderr.splitlines() if "added -lv 4" in ln]
    assert note == ["offload-planner: added -lv 4: this llama-server logs its buffer sizes only at "
                    "verbosity 4 (give --no-verbose-log to launch the command exactly as written)"], r.stderr
    assert r.returncode == 0, r.stderr


def test_a_header_only_model_is_named_as_the_reason(llama_server: Path) -> None:
    """The README's demo file given to launch: the last line was llama-server's "data is not within the
    file bounds, model is corrupted or incomplete", read as a damaged download."""
    demo = str(Path(__file__).resolve().parents[1] / "resources" / "DeepSeek-V3-Q4_K_M.header.gguf")
    r = run_cli("launch", demo, "--no-detect", "--server", str(llama_server), "--quiet", "--", "-ngl", "0",
                timeout=120)
    assert r.returncode == 3, r.stderr
    lines = r.stderr.splitlines()
    # said before llama-server starts, then again with its refusal
    assert lines[0] == (f"offload-planner: note: {demo} is header-only (the tensors' shapes, not their "
                        "data): llama-server will refuse it; launching as asked"), r.stderr
    assert "not within the file bounds" in lines[-2], r.stderr
    assert lines[-1] == (f"offload-planner: {demo} is header-only (the tensors' shapes, not their data): "
                         "llama-server needs the complete GGUF; launch that (plan, fit and inspect read this "
                         "one)")


def test_bench_on_an_rpc_device_says_where_its_speeds_come_from(
    llama_bin_dir: Path, small_model: Path, tmp_path: Path
) -> None:
    """launch --bench with the layers on an rpc-server: "a remote (RPC) device dominates; its figures are
    declared, not calibrated" to a user who had declared nothing (the estimate used the defaults, 500
    GB/s and 50 TFLOPS, and was 87x too fast on pp here)."""
    from tests.support.rpc import rpc_servers

    with rpc_servers(llama_bin_dir, 1, tmp_path) as (endpoint,):
        server = str(llama_bin_dir / "llama-server")
        r = run_cli("launch", str(small_model), "--no-detect", "--server", server, "--quiet", "--bench",
                    "--no-store", "--bench-prompt", "64", "--bench-gen", "8", "--", "--rpc", endpoint,
                    "-ngl", "999", "-c", "512", "-np", "1", "-fit", "off", timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    notes = [ln.strip() for ln in r.stdout.splitlines() if "remote (RPC)" in ln]
    assert notes == [f"calibration: {part} (bottleneck RPC0): a remote (RPC) device dominates, and its "
                     "speeds are not calibrated: give them on its --device (bw=, tflops=); the estimate's "
                     "assumptions name any default" for part in ("tg", "pp")], r.stdout


def test_a_context_too_small_for_the_bench_says_so(llama_server: Path, small_model: Path) -> None:
    """launch --bench on -c 512: llama-server refuses the 512-token prompt, and the check said only
    "no answer to the benchmark request (HTTP Error 400: Bad Request)"; the window's Bench likewise."""
    r = run_cli("launch", str(small_model), "--no-detect", "--server", str(llama_server), "--quiet",
                "--bench", "--no-store", "--", "-c", "512", "-np", "1", "-fit", "off", timeout=120)
    assert r.returncode == 3, r.stderr[-2000:]
    last = r.stderr.splitlines()[-1]
    assert last.endswith("/completion: llama-server refused the benchmark request (HTTP 400: request (512 "
                         "tokens) exceeds the available context size (512 tokens), try increasing it); its "
                         "512-token prompt and 64 generated tokens need a context of 576 tokens a slot: "
                         "raise -c (it is shared by the -np slots)"), last
    assert last.startswith("offload-planner: speed check failed: http://127.0.0.1:"), last
