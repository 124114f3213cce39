"""Hostile llama-server command lines through ``offload-planner plan``: only our own errors escape
and no input hangs.

Inputs come from a seeded grammar: ``-ot`` patterns with nested quantifiers, alternations under
repeats, back-references, lookaheads, deep nesting and huge counted repeats; numeric flags with
huge, negative and odd values; hundreds of repeated flags; every dialect.  Each input runs the
CLI's ``plan`` in-process under its own deadline; the run stops after a fixed time budget and
prints how many inputs it tried and how they ended.
"""

from __future__ import annotations

import contextlib
import io
import random
from pathlib import Path

from tests.support.fuzz import run_budget

from offload_planner.cli import main

_ATOMS = ["blk", "ffn", "exps", "up", "down", "gate", "attn", "weight", "_", r"\.", ".", r"\d", r"\w", r"\D",
          "[a-z0-9_.]", "[^_]", "[0-9]", "1", "2", "Z", "x", "^", "$", r"\b"]
_QUANTS = ["*", "+", "?", "*?", "+?", "{2}", "{1000}"]
_WILD_QUANTS = ["{1,3}", "{0,}", "{0,99999}", "{3,2}", "{", "**"]  # a ',' also splits an -ot list
_JUNK = ["(", ")", "[", "]", "{", "}", "\\", "|", "(?", "(?<=a)", "(?P<n>a)", "[[:alpha:]]", "[z-a]", "\\c",
         "\\x4", "\\u12", "\\9", "(?i)"]
_DEVICES = ["CPU", "CUDA0"]
_WILD_DEVICES = ["cuda0", "RPC0", "Vulkan9", "", "CPU=CPU"]
_NUMBERS = ["0", "1", "3", "8", "61", "512", "4096", "99999", "99999999", "2147483647"]
_WILD_NUMBERS = ["-1", "-2", "2147483648", "-2147483649", "9" * 30, "1e3", "0x10", "auto", "all", "", " 7",
                 "nan", "inf"]


def _pattern(rng: random.Random, wild: bool, depth: int = 0) -> str:
    """A random -ot pattern, often nested and quantified; ``wild``: sometimes broken as well."""
    roll = rng.random()
    if depth > 3 or roll < 0.35:
        text = rng.choice(_ATOMS)
    elif roll < 0.55:
        inner = "".join(_pattern(rng, wild, depth + 1) for _ in range(rng.randint(1, 3)))
        text = rng.choice(["({})", "(?:{})", "(?={})", "(?!{})"]).format(inner)
    elif roll < 0.7:
        alts = [_pattern(rng, wild, depth + 1) for _ in range(rng.randint(2, 3))]
        text = "(" + "|".join(alts) + ")"
    elif roll < 0.8:
        text = "(" + _pattern(rng, wild, depth + 1) + ")" + r"\1"
    elif roll < 0.85:
        n = rng.choice((50, 101, 300, 1000))
        close = rng.choice((n, n - 1, 0)) if wild else n
        text = "(" * n + _pattern(rng, wild, depth + 1) + ")" * close
    elif roll < 0.88 and wild:
        text = rng.choice(_JUNK)
    else:
        text = "".join(_pattern(rng, wild, depth + 1) for _ in range(rng.randint(2, 4)))
    if rng.random() < 0.45:
        text += rng.choice(_QUANTS + _WILD_QUANTS if wild else _QUANTS)
    return text


def _flag(rng: random.Random, wild: bool) -> list[str]:
    """One flag and its values; tame flags exist in every dialect and take values it accepts."""
    kind = rng.random()
    if kind < 0.45:
        devices = _DEVICES + _WILD_DEVICES if wild else _DEVICES
        n = rng.randint(1, 3) if wild else 1
        rules = ",".join(f"{_pattern(rng, wild)}={rng.choice(devices)}" for _ in range(n))
        return [rng.choice(["-ot", "--override-tensor"]), rules]
    if kind < 0.75:
        flags = ["-ngl", "--n-cpu-moe", "-c", "--ctx-size", "-np"]
        flags += ["--n-cpu-ffn", "-b", "-ub", "-mg", "-t", "-fitt", "-fitc"] if wild else []
        return [rng.choice(flags), rng.choice(_NUMBERS + _WILD_NUMBERS if wild else _NUMBERS)]
    tame = [["--cpu-moe"], ["-sm", rng.choice(["none", "layer"])], ["-ts", rng.choice(["1,1", "3,1"])],
            ["-fa", rng.choice(["on", "off"])], ["-ctk", "q8_0"], ["-ctv", "q8_0"], ["-nkvo"]]
    if not wild:
        return rng.choice(tame)
    return rng.choice([*tame,
        ["-sm", rng.choice(["row", "tensor", "graph", "x"])],
        ["-ts", rng.choice(["3/1", "0,0", "1e308,1", "-1,2", "", ",,,"])],
        ["-fa", rng.choice(["auto", "2"])], ["-ctk", rng.choice(["q4_0", "f32", "bogus"])],
        ["--no-mmap"], ["-fit", rng.choice(["on", "off", "maybe"])], ["--swa-full"], ["-kvu"], ["--mlock"],
        ["-mla", "3"], ["-amb", "512"], ["--no-op-offload"],
        ["--rpc", rng.choice(["127.0.0.1:1", "a:b,c", ""])], ["--unknown-flag"], ["-ngl"]])


def _command_line(rng: random.Random) -> tuple[str, str, list[str]]:
    """(model, dialect, server arguments): a few flags, or hundreds of repeats of one; 6 in 10 tame
    (every flag valid, so the projection runs), the rest wild."""
    model = rng.choice(["deepseek2", "qwen3moe", "gemma3"])
    dialect = rng.choice(["llama.cpp", "llama.cpp", "llama.cpp-2025", "ik_llama.cpp"])
    wild = rng.random() < 0.4
    if rng.random() < 0.1:
        one = _flag(rng, wild)
        return model, dialect, one * rng.choice((100, 500, 2000))
    return model, dialect, [a for _ in range(rng.randint(1, 6)) for a in _flag(rng, wild)]


def test_hostile_command_lines_only_raise_our_errors(small_models: dict[str, Path]) -> None:
    def check(case: tuple[str, str, list[str]]) -> str:
        model, dialect, server_args = case
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["plan", str(small_models[model]), "--no-detect", "--backend", dialect,
                         "--device", "CUDA0=24GiB", "--device", "CPU=64GiB", "--", *server_args])
        message = err.getvalue()
        assert "Traceback" not in message, message
        if code in (0, 3):  # 3: planned, a device over capacity
            return "planned"
        assert code == 2, code
        lines = message.splitlines()  # our errors only, each on its own line naming what is wrong
        assert lines and all(ln.startswith("offload-planner: error: ") for ln in lines), message
        if any("backtracks" in ln or "nested more than" in ln for ln in lines):
            return "refused: -ot rule the planner cannot evaluate"
        return "refused: arguments llama-server refuses"

    tally = run_budget("command-line fuzz", _command_line, check, seed=12, seconds=15)
    assert tally.tried >= 20, tally.report()
    assert tally.counts["planned"] > 0, tally.report()
    assert tally.counts["refused: -ot rule the planner cannot evaluate"] > 0, tally.report()
