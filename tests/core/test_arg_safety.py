"""What a command can make llama-server do: secrets found in every spelling, flags that expose the
server, write files, run tools or reach other machines (from the pinned build's common/arg.cpp)."""

from __future__ import annotations

import pytest

from offload_planner.core.arg_safety import is_loopback, masked, review_args, strip_secrets


def test_secrets_are_found_in_every_spelling_and_dialect() -> None:
    for dialect in ("llama.cpp", "llama.cpp-2025", "ik_llama.cpp"):
        kept, removed = strip_secrets(
            [
                "-t",
                "8",
                "--api-key",
                "k1",
                "-hft",
                "h1",
                "--hf-token",
                "h2",
                "--hf_token",
                "h3",
                "--api-key=k2",
                "--port",
                "8080",
            ],
            dialect,
        )
        assert kept == ["-t", "8", "--port", "8080"], dialect
        assert removed == ["--api-key", "-hft", "--hf-token", "--hf_token", "--api-key"]


def test_a_value_that_looks_like_a_secret_flag_is_a_value() -> None:
    kept, removed = strip_secrets(["--alias", "--api-key", "--api-key-file", "/k", "--ssl-key-file", "/s"])
    assert kept == ["--alias", "--api-key", "--api-key-file", "/k", "--ssl-key-file", "/s"] and removed == []


def test_masked_hides_only_secret_values() -> None:
    assert masked(["--api-key", "k", "--hf-token=h", "-t", "4"]) == [
        "--api-key",
        "***",
        "--hf-token=***",
        "-t",
        "4",
    ]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.com", "10.0.0.1"])
def test_other_hosts(host: str) -> None:
    assert not is_loopback(host)


def _flags(args: list[str], dialect: str = "llama.cpp") -> dict[str, str]:
    return {c.flag: c.what for c in review_args(args, dialect)}


def test_a_public_host_without_an_api_key_is_flagged() -> None:
    concerns = review_args(["--host", "0.0.0.0", "--port", "8080"])
    assert [c.flag for c in concerns] == ["--host"]
    assert "0.0.0.0" in concerns[0].text and "no --api-key" in concerns[0].text
    with_key = review_args(["--host", "0.0.0.0", "--api-key-file", "/k"])
    assert len(with_key) == 1 and "api-key" not in with_key[0].text
    assert review_args(["--host", "127.0.0.1,::1"]) == [] and review_args(["--host", "/tmp/s.sock"]) == []


def test_flags_that_write_files() -> None:
    got = _flags(
        [
            "--log-file",
            "/etc/x",
            "--slot-save-path",
            "/tmp",
            "-lcd",
            "/c",
            "--log-prompts-dir",
            "/p",
            "-lcs",
            "/static",
        ]
    )
    assert got == {
        "--log-file": "writes",
        "--slot-save-path": "writes",
        "-lcd": "writes",
        "--log-prompts-dir": "writes",
    }, "the static lookup cache is only read"
    assert _flags(["--log-file", "/x", "--slot-save-path", "/tmp"], "ik_llama.cpp") == {
        "--log-file": "writes",
        "--slot-save-path": "writes",
    }


def test_flags_that_run_tools_or_expose_files() -> None:
    got = _flags(
        [
            "--tools",
            "all",
            "-ag",
            "--path",
            "/srv",
            "--media-path",
            "/m",
            "--props",
            "--cors-origins",
            "*",
            "--models-preset",
            "/p.ini",
        ]
    )
    assert got == {
        "--tools": "runs",
        "-ag": "runs",
        "--path": "exposes",
        "--media-path": "exposes",
        "--props": "exposes",
        "--cors-origins": "exposes",
        "--models-preset": "runs",
    }


def test_flags_that_reach_other_machines() -> None:
    got = review_args(
        ["--rpc", "127.0.0.1:50052,10.1.2.3:50052", "-hf", "org/model", "-mu", "https://x/m.gguf"]
    )
    assert [(c.flag, c.what) for c in got] == [("--rpc", "network"), ("-hf", "network"), ("-mu", "network")]
    assert "10.1.2.3:50052" in got[0].text


def test_environment_forms_are_reviewed() -> None:
    got = review_args([], env={"LLAMA_ARG_HOST": "0.0.0.0", "LLAMA_ARG_LOG_FILE": "/x"})
    assert {c.flag for c in got} == {"LLAMA_ARG_HOST", "LLAMA_ARG_LOG_FILE"}


def test_a_second_model_and_a_secret_are_named() -> None:
    got = review_args(["-m", "/a.gguf", "-t", "4", "-m", "/b.gguf", "--api-key", "k"])
    assert [(c.flag, c.what) for c in got] == [("-m", "runs"), ("--api-key", "secret")]
    assert "/b.gguf" in got[0].text and "k" not in got[1].text.split()


def test_an_rpc_entry_is_judged_by_the_host_llama_server_connects_to() -> None:
    """ggml-rpc's host is the text before the first ':': ``127.0.0.1:50052:7`` stays on this machine."""
    assert review_args(["--rpc", "127.0.0.1:50052:7,localhost:50053x"]) == []
    assert [c.flag for c in review_args(["--rpc", "10.0.0.5:50052:7"])] == ["--rpc"]
