"""The commands' options read without building their argparse parser (cli_fastparse) are what argparse
reads, attribute for attribute and in the same order; whatever argparse refuses or reads another way
(help, abbreviations, values that look like options, bad types or choices) is left to it."""

from __future__ import annotations

import argparse
import contextlib
import io
import random

import pytest

from offload_planner import cli
from offload_planner.cli_fastparse import Recorder, fast_parse


def argparse_reads(argv: list[str]) -> argparse.Namespace | None:
    """What the real parser makes of ``argv`` (None: it exits, with an error or the help)."""
    parser = cli.build_parser(argv[0])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return cli._parse(parser, argv)
        except SystemExit:
            return None


def same(argv: list[str]) -> argparse.Namespace | None:
    quick = cli._quick_parse(argv)
    real = argparse_reads(argv)
    if quick is not None:
        assert real is not None, argv
        assert list(vars(quick).items()) == list(vars(real).items()), argv
    return quick


READ_QUICKLY = [
    ["plan", "m.gguf"],
    ["plan", "--device", "CUDA0=24GiB", "m.gguf", "--device=CPU=64GiB", "--json", "--no-detect"],
    ["plan", "m.gguf", "--prompt", "512", "--depth=100", "--spec-accept", "0.5", "--explain"],
    ["plan", "m.gguf", "--backend", "ik_llama.cpp", "--backend=llama.cpp"],
    ["plan", "", "--backend="],
    ["fit", "m.gguf", "--goal", "tg", "--allow-kv-quant", "--device", "CUDA0=8GiB"],
    ["launch", "m.gguf", "--port", "8080", "--env", "A=1", "--env", "B=2", "--timeout", "5.5", "--yes"],
]

LEFT_TO_ARGPARSE = [
    ["plan"],  # the model missing
    ["plan", "a.gguf", "b.gguf"],
    ["plan", "m.gguf", "-h"],
    ["plan", "m.gguf", "--help"],
    ["plan", "m.gguf", "--dev", "CUDA0=24GiB"],  # an abbreviation
    ["plan", "m.gguf", "--json=1"],
    ["plan", "m.gguf", "--prompt", "0"],
    ["plan", "m.gguf", "--prompt", "-5"],
    ["plan", "m.gguf", "--backend", "--json"],
    ["plan", "m.gguf", "--device"],
    ["plan", "m.gguf", "-ngl", "99"],
    ["plan", "-", "--json"],
    ["plan", "m.gguf", "--version"],
    ["fit", "m.gguf", "--goal", "fastest"],
    ["launch", "m.gguf", "--port", "x"],
    ["inspect", "m.gguf"],
    ["gui", "m.gguf"],
    ["m.gguf"],
    [],
]


@pytest.mark.parametrize("argv", READ_QUICKLY, ids=" ".join)
def test_read_quickly_as_argparse_reads(argv: list[str]) -> None:
    assert same(argv) is not None


@pytest.mark.parametrize("argv", LEFT_TO_ARGPARSE, ids=" ".join)
def test_left_to_argparse(argv: list[str]) -> None:
    assert cli._quick_parse(argv) is None


WORDS = {
    "plan": ["m.gguf", "x", "--device", "CUDA0=24GiB", "--device=CPU=1TiB", "--backend", "ik_llama.cpp",
             "--no-detect", "--json", "--explain", "--prompt", "4096", "--prompt=0", "--depth", "7",
             "--spec-accept", "0.7", "--spec-accept=2", "--dev", "--no", "-h", "-", "", "--json=", "-1"],
    "fit": ["m.gguf", "--goal", "pp", "balanced", "nope", "--allow-kv-quant", "--prompt", "12", "--json",
            "--device", "CUDA0=8GiB", "--go=tg", "-x"],
    "launch": ["m.gguf", "--port", "99", "--timeout", "1e3", "--env", "K=V", "--wrapper", "nice",
               "--bench", "--bench-gen", "4", "--yes", "--host", "::1", "--port=x", "--quiet"],
}


@pytest.mark.parametrize("command", sorted(WORDS))
def test_random_command_lines_agree(command: str) -> None:
    """Random command lines from each command's words: where the quick reader answers, argparse reads
    the same; most well-formed ones are read quickly."""
    rng = random.Random(10)
    quick = 0
    for _ in range(400):
        argv = [command, *rng.choices(WORDS[command], k=rng.randint(0, 7))]
        quick += same(argv) is not None
    assert quick >= 20


@pytest.mark.parametrize("parser_kwargs, argument_kwargs", [
    ({"prefix_chars": "+"}, {}),
    ({"argument_default": "x"}, {}),
    ({"allow_abbrev": False}, {}),
    ({}, {"default": argparse.SUPPRESS}),
    ({}, {"nargs": "?"}),
    ({}, {"dest": "other"}),
    ({}, {"action": "count"}),
    ({}, {"type": int, "default": "1"}),
])
def test_parsers_the_quick_reader_does_not_read(parser_kwargs: dict[str, object],
                                                argument_kwargs: dict[str, object]) -> None:
    """A parser or option that reads arguments in a way the quick reader does not is left to argparse."""
    rec = Recorder()
    p = rec.add_parser("x", help="h", **parser_kwargs)
    p.add_argument("model")
    p.add_argument("--opt", **argument_kwargs)
    assert fast_parse(rec.parsers[0], ["m.gguf"], "x") is None
    plain = Recorder()
    q = plain.add_parser("x", help="h")
    q.add_argument("model")
    q.add_argument("--opt")
    want = argparse.Namespace(command="x", model="m.gguf", opt=None)
    assert fast_parse(plain.parsers[0], ["m.gguf"], "x") == want
