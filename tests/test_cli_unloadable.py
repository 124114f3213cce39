"""Models llama.cpp refuses to load (newcomer4): a GGUF without ``context_length``,
``embedding_length`` or ``block_count``, with 0 blocks, more experts used than it has or none used,
or a tensor of a block past ``block_count``. The pinned llama-server refuses each at load ("key not
found in model: qwen3moe.context_length", GGML_ASSERT n_expert_used_max <= n_expert, ...). Before,
the planner planned them: ``plan`` on a file without ``context_length`` never returned (micro-batches
of 0 tokens), ``fit`` died with a ZeroDivisionError, a file without ``block_count`` with an
IndexError in both, and the rest printed a command llama-server cannot run. Each is now one line
naming the file and the key or tensor, exit 2, at once; the window refuses to open them as it
refuses a damaged file. A file whose ``context_length`` is 0 loads in llama.cpp with ``-c N`` only:
plan and fit refuse it without -c and plan it with -c; the window says so in Problems, its speed
line and Fastest plan instead of 'float division by zero'.

Files are the project's synthetic Qwen3-MoE (complete, real tensor bytes) rewritten by gguf-py with
one key dropped or changed, or one tensor renamed. The window's side: tests/ui/test_unloadable_window.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.cli import run_cli
from tests.support.gguf_rewrite import rewrite
from tests.support.refusals import refused

run = run_cli


CASES = {
    "no-context": (dict(drop="qwen3moe.context_length"), "key not found in model: qwen3moe.context_length"),
    "no-embedding": (dict(drop="qwen3moe.embedding_length"),
                     "key not found in model: qwen3moe.embedding_length"),
    "no-blocks": (dict(drop="qwen3moe.block_count"), "key not found in model: qwen3moe.block_count"),
    "0-blocks": (dict(u32=("qwen3moe.block_count", 0)), "'qwen3moe.block_count': 0 blocks"),
    "9-of-8-experts": (dict(u32=("qwen3moe.expert_used_count", 9)), "9 experts used of 8"),
    "0-experts-used": (dict(u32=("qwen3moe.expert_used_count", 0)), "no expert used of 8"),
    "block-400": (dict(rename=("blk.3.ffn_up_exps.weight", "blk.400.ffn_up_exps.weight")),
                  "tensor 'blk.400.ffn_up_exps.weight' is in block 400, but qwen3moe.block_count is 4"),
}


@pytest.fixture(scope="module")
def unloadable(small_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("unloadable")
    src = small_models["qwen3moe"]
    out = {name: rewrite(src, root / f"{name}.gguf", **kw) for name, (kw, _) in CASES.items()}  # type: ignore[arg-type]
    out["context-0"] = rewrite(src, root / "context-0.gguf", u32=("qwen3moe.context_length", 0))
    return out


@pytest.mark.parametrize("command", ["plan", "fit"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_model_llama_cpp_refuses_is_one_line(unloadable: dict[str, Path], case: str, command: str) -> None:
    path = unloadable[case]
    r = run(command, str(path), "--device", "CUDA0=24GiB", "--no-detect", timeout=30)
    line = refused(r, 2, str(path), CASES[case][1])
    assert "llama.cpp" in line, line


def test_inspect_still_shows_such_a_model(unloadable: dict[str, Path]) -> None:
    """The reader reads what is there (context 0): only planning needs a model llama.cpp loads."""
    r = run("inspect", str(unloadable["no-context"]), "--no-layers")
    assert r.returncode == 0, r.stderr
    assert "context 0" in r.stdout
    assert r.stdout.splitlines()[-1] == ("note: key not found in model: qwen3moe.context_length (llama.cpp "
                                         "refuses to load a model without it); plan, fit and the window "
                                         "refuse it")
    fine = run("inspect", str(unloadable["context-0"]), "--no-layers")  # loads in llama.cpp with -c N
    assert fine.returncode == 0 and "note:" not in fine.stdout, fine.stdout


@pytest.mark.parametrize("command", ["plan", "fit"])
def test_a_trained_context_of_0_needs_c(unloadable: dict[str, Path], command: str) -> None:
    path = str(unloadable["context-0"])
    for after in ([], ["--", "-c", "0"]):
        r = run(command, path, "--device", "CUDA0=24GiB", "--no-detect", *after, timeout=30)
        refused(r, 2, "qwen3moe.context_length", path, "is 0", "-c 4096")
    r = run(command, path, "--device", "CUDA0=24GiB", "--no-detect", "--", "-c", "2048", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "-c 2048" in r.stdout


def test_a_draft_model_llama_cpp_refuses_is_named(small_models: dict[str, Path],
                                                 unloadable: dict[str, Path]) -> None:
    draft = str(unloadable["no-context"])
    r = run("plan", str(small_models["qwen3moe"]), "--no-detect", "--", "-md", draft,
            "--spec-type", "draft-simple", timeout=30)
    assert r.returncode == 2, (r.stdout[-500:], r.stderr)
    assert "Traceback" not in r.stderr
    assert draft in r.stderr and "key not found in model: qwen3moe.context_length" in r.stderr, r.stderr
