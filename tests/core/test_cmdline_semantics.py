"""Refusals that need the devices or the model, and silent clamps."""

from __future__ import annotations

import pytest

from offload_planner.core.cmdline import (
    Dialect,
    Stage,
    check_semantics,
    parse_server_args,
    rpc_buffer_type_names,
    rpc_device_names,
    semantic_notes,
)

L = Dialect.LLAMA_CPP
EP1, EP2 = "127.0.0.1:50052", "127.0.0.1:50053"


def _errors(argv: list[str], devices: list[str], dialect: Dialect = L, **kw: bool) -> list[str]:
    parsed = parse_server_args(argv, dialect=dialect)
    assert parsed.errors == []
    return [e.message for e in check_semantics(parsed, devices, **kw)]


def test_buffer_types_cpu_and_devices() -> None:
    assert _errors(["-ot", "a=CPU,b=CUDA0", "-ot", "c=CUDA1"], ["CUDA0", "CUDA1"]) == []
    # captured: stdout "Available buffer types:\n  CPU\n", stderr:
    assert _errors(["-ot", "foo=BAR"], []) == ['error while handling argument "-ot": unknown buffer type']
    for host_only in ("CUDA_Host", "CPU_Mapped", "CPU_REPACK"):
        assert _errors(["-ot", f"x={host_only}"], ["CUDA0"]), host_only


def test_rpc_buffer_type_names_verified_with_ggml_rpc_server() -> None:
    # captured with two ggml-rpc-server instances: --list-devices shows RPC0, RPC1; the -ot names are
    # RPC0[127.0.0.1:P1] and RPC0[127.0.0.1:P2] (index on that server, then the endpoint)
    assert rpc_device_names([EP1, EP2]) == ["RPC0", "RPC1"]
    assert rpc_buffer_type_names([EP1, EP2]) == [f"RPC0[{EP1}]", f"RPC0[{EP2}]"]
    assert rpc_buffer_type_names([EP1], [2]) == [f"RPC0[{EP1}]", f"RPC1[{EP1}]"]
    assert _errors(["--rpc", f"{EP1},{EP2}", "-ot", f"a=RPC0[{EP2}]", "-dev", "RPC0,RPC1"], []) == []
    wrong = _errors(["--rpc", EP1, "-ot", "a=RPC0"], [])
    assert wrong == ['error while handling argument "-ot": unknown buffer type']
    parsed = parse_server_args(["--rpc", EP1, "-ot", "a=RPC0"], dialect=L)
    assert "RPC0[127.0.0.1:50052]" in check_semantics(parsed, [])[0].explanation


def test_rpc_must_come_first() -> None:
    # captured: "-ot x=RPC0[ep] --rpc ep" -> unknown buffer type; "-dev RPC0 --rpc ep" -> invalid device
    assert _errors(["-ot", f"x=RPC0[{EP1}]", "--rpc", EP1], []) == [
        'error while handling argument "-ot": unknown buffer type'
    ]
    assert _errors(["-dev", "RPC0", "--rpc", EP1], []) == [
        'error while handling argument "-dev": invalid device: RPC0'
    ]
    assert _errors(["-dev", "CUDA0"], []) == ['error while handling argument "-dev": invalid device: CUDA0']
    parsed = parse_server_args(["-ot", f"x=RPC0[{EP1}]"], dialect=L, env={"LLAMA_ARG_RPC": EP1})
    assert check_semantics(parsed, []) == []


def test_quantized_v_needs_flash_attention() -> None:
    # captured (tiny GGUF, -fa off -ctv q8_0): "E llama_init_from_model: quantized V cache requires ..."
    assert _errors(["-fa", "off", "-ctv", "q8_0"], []) == [
        "llama_init_from_model: quantized V cache requires flash_attn to be enabled"
    ]
    assert _errors(["-fa", "auto", "-ctv", "q8_0"], []) == []  # auto turns FA on
    assert _errors(["-fa", "off", "-ctv", "bf16"], []) == []


def test_mla_needs_equal_k_and_v_types() -> None:
    msg = "llama_init_from_model: model does not support different K (q8_0) and V (f16) cache types"
    assert _errors(["-ctk", "q8_0"], [], is_mla=True) == [msg]
    assert _errors(["-ctk", "q8_0", "-ctv", "q8_0"], [], is_mla=True) == []
    assert _errors(["-ctk", "q8_0"], [], is_mla=False) == []


def test_device_dependent_load_errors() -> None:
    assert _errors(["-sm", "row"], ["CUDA0", "CUDA1"]) == [
        "llama_model_load: error loading model: device CUDA0 does not support split buffers"
    ]
    assert _errors(["-sm", "tensor", "-fa", "off"], ["CUDA0", "CUDA1"]) == [
        "llama_init_from_model: SPLIT_MODE_TENSOR requires flash_attn to be enabled"
    ]
    assert _errors(["-sm", "none", "-mg", "2"], ["CUDA0", "CUDA1"]) == [
        "llama_prepare_model_devices: invalid value for main_gpu: 2 (available devices: 2)"
    ]


def test_ik_checks() -> None:
    ik = Dialect.IK
    assert _errors(["-sm", "graph"], ["CUDA0"], ik) == [
        "It is not possible to use split mode 'graph' with less than 2 devices"
    ]
    assert _errors(["--fit", "-ot", "x=CPU"], ["CUDA0"], ik) == [
        "Manual tensor overrides cannot be used with --fit"
    ]
    assert _errors(["-ot", "x=CUDA1"], ["CUDA0"], ik) == ["error: invalid parameter for argument: -ot"]


def test_accepts_bare_server_args_with_dialect() -> None:
    parsed = parse_server_args(["-ot", "x=CUDA9"], dialect="ik_llama.cpp")
    errors = check_semantics(parsed.args, ["CUDA0"], dialect="ik_llama.cpp")
    assert [e.stage for e in errors] == [Stage.PARSE]


@pytest.mark.parametrize(
    ("argv", "note"),
    [
        (["-b", "64", "-ub", "128"], True),
        (["-ub", "4096"], True),
        (["-ub", "2048"], False),
        (["-b", "512", "-ub", "512"], False),
    ],
)
def test_ubatch_larger_than_batch_is_clamped_silently(argv: list[str], note: bool) -> None:
    # verified: -b 64 -ub 128 starts and logs "n_batch = 64", "n_ubatch = 64" (no warning, no error)
    parsed = parse_server_args(argv, dialect=L)
    assert check_semantics(parsed, []) == []
    assert bool(semantic_notes(parsed)) is note
