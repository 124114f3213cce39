"""Hostile input through the entry point: one clear line, exit 2, fast; never a hang or traceback.

Every run has a timeout, so a regression fails here instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offload_planner.cli import demo_model_path

TIMEOUT = 20


def run(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "offload_planner", *args], capture_output=True, text=True,
                       timeout=TIMEOUT, env={**os.environ, "HOME": str(Path.home())})
    return r, time.monotonic() - t0


def one_clear_error(r: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("offload-planner: error: ") and r.stderr.count("\n") == 1, r.stderr
    for f in fragments:
        assert f in r.stderr, r.stderr
    return r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_fifo_as_model_is_refused(tmp_path: Path, command: str) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    extra = ["--no-detect"] if command == "plan" else []
    r, _ = run(command, str(fifo), *extra)
    one_clear_error(r, f"{fifo}: is a FIFO (named pipe), not a GGUF file")


def test_directory_as_model_is_refused(tmp_path: Path) -> None:
    r, _ = run("inspect", str(tmp_path))
    assert one_clear_error(r) == f"offload-planner: error: {tmp_path}: is a directory, not a GGUF file\n"


# --- -ot patterns that backtrack catastrophically, nest too deep, or come by the thousand -------

HANGS = [r"(.+)+Z", r"([a-z0-9_.]+)*Z", r"(\w+\.?)+Z", r"(.|.)*Z", r"((.)*)*Z", r"(?:.*){1000}Z"]


def plan(*server_args: str, json_out: bool = False) -> tuple[subprocess.CompletedProcess[str], float]:
    ours = ["--json"] if json_out else []
    return run("plan", str(demo_model_path()), "--no-detect", *ours, "--", *server_args)


@pytest.mark.parametrize("pattern", HANGS)
def test_catastrophic_ot_pattern_is_one_clear_error(pattern: str) -> None:
    """These never returned (the planner backtracked as std::regex does)."""
    r, _ = plan("-ot", f"{pattern}=CPU")
    one_clear_error(r, f"-ot '{pattern}=CPU': the pattern backtracks ",
                    "llama.cpp's std::regex backtracks the same way and would stall")


def test_thousand_open_parentheses_is_one_clear_error() -> None:
    """1,000 '(' were a RecursionError traceback."""
    r, _ = plan("-ot", "(" * 1000 + "=CPU")
    one_clear_error(r, "groups nested more than 100 deep")


def test_ten_thousand_rules_and_huge_counts_finish() -> None:
    """10,000 -ot rules took 9-24 s, --n-cpu-moe 99999 59 s (99,999 rules on every tensor)."""
    rules = [a for i in range(10_000) for a in ("-ot", rf"blk\.{i}\.ffn_up_exps=CPU")]
    for args in (rules, ["--n-cpu-moe", "99999"], ["-ngl", "99999999", "--n-cpu-moe", "99999"]):
        r, _ = plan(*args, json_out=True)
        assert r.returncode in (0, 3), r.stderr[-2000:]  # 3: planned, a device over capacity
        d = json.loads(r.stdout)
        assert d["tensors"]["blk.60.ffn_up_exps.weight"] == "CPU"
        if args[0] == "--n-cpu-moe":
            moe = [w for w in d["warnings"] if w.startswith("--n-cpu-moe")]
            assert moe == ["--n-cpu-moe: the rules for layers 0-2,61-511 match no tensor (454 of its 512)"]


def test_ik_cache_type_it_refuses_is_listed_not_a_crash() -> None:
    """Found by the command-line fuzz: -ctk bogus with ik_llama.cpp was a KeyError traceback."""
    r, _ = run("plan", str(demo_model_path()), "--no-detect", "--backend", "ik_llama.cpp", "--",
               "-ctk", "bogus")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "error: unsupported KV cache type: bogus" in r.stdout + r.stderr


# --- GGUF header values the file cannot back -------------------------------------------------------


def _gguf(path: Path, **values: tuple[str, object]) -> Path:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    for key, (kind, value) in values.items():
        getattr(w, f"add_{kind}")(f"llama.{key}", value)
    w.add_tensor("token_embd.weight", np.zeros((2, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"block_count": ("uint32", 2**31 - 1)}, "'llama.block_count': 2147483647 blocks: llama.cpp loads"),
        ({"block_count": ("uint32", 2**32 - 1)}, "key 'llama.block_count': 4294967295 blocks"),
        ({"block_count": ("uint32", 2), "leading_dense_block_count": ("float32", float("inf"))},
         "key 'llama.leading_dense_block_count': inf is a float where llama.cpp reads an integer"),
        ({"block_count": ("uint32", 2), "attention.head_count_kv": ("float32", float("nan"))},
         "key 'llama.attention.head_count_kv': nan is a float"),
    ],
)
def test_header_values_the_file_cannot_back(tmp_path: Path, values: dict[str, tuple[str, object]],
                                            fragment: str) -> None:
    """2^31-1 blocks took 260 s and then a MemoryError; inf/NaN were OverflowError/ValueError."""
    path = _gguf(tmp_path / "m.gguf", **values)
    for command in (["inspect", str(path)], ["plan", str(path), "--no-detect"]):
        r, _ = run(*command)
        one_clear_error(r, f"{path} at byte ", fragment)
