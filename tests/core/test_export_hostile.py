"""Hostile arguments in every export format: each export is exact for its consumer (real bash,
real sh, PyYAML and a POSIX shell for llama-swap, docker's env-file rules) or refused with one
message naming the argument and the format."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offload_planner.core.cmdline import format_command
from offload_planner.core.cmdline.emit import ExportRefused
from offload_planner.core.command_text import split_command_text

#: Values with every kind of trouble a path or a flag's value can hold (no NUL: no argv holds one).
HOSTILE = [
    "/m/a\nb.gguf", "/m/a\rhidden", "\x1b[31mred\x1b[0m", "\x1b]0;title\x07", "\x9b2J", "%PATH%",
    "!x!", "^&|<>\"'$`", "back\\slash\\", "\\\\server\\share", "ünïcödé ✓ 模型", "-leading-dash", "",
    "x" * 5000, "a\u202eb", "line\u2028sep", "\ufeffbom", "tab\tin", "$(touch pwned)", "'", "\"", "\\",
    "a\x7fb", "\u2019quote\u2018", os.fsdecode(b"/m/\xff\xfe.gguf"),
]
_PRINT = "f() { for a in \"$@\"; do printf '%s\\0' \"$a\"; done; }\n"


def _run(shell: str, text: str) -> list[bytes]:
    out = subprocess.run([shell, "-c", _PRINT + text], capture_output=True, timeout=20, check=True)
    return out.stdout.split(b"\0")[:-1]


def _argv(*values: str) -> list[str]:
    return ["f", "-m", *values[:1], "--alias", *values[1:2], "-ot", *values[2:3], "--api-key", *values[3:]]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("multiline", [False, True])
def test_bash_gives_back_every_hostile_argument(multiline: bool) -> None:
    argv = ["f", *HOSTILE]
    text = format_command(argv, "bash", multiline=multiline)
    assert _run("bash", text) == [os.fsencode(a) for a in HOSTILE]


def test_bash_text_has_no_raw_control_character() -> None:
    text = format_command(["f", *HOSTILE], "bash")
    assert not any(c in text for c in "\n\r\x1b\x07\x9b\x7f\u202e\u2028\ufeff")
    assert "$'/m/a\\nb.gguf'" in text and "$'\\x1b[31mred\\x1b[0m'" in text
    assert "$'/m/\\xff\\xfe.gguf'" in text  # the undecodable bytes, exactly


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12),
                max_size=4))
def test_bash_round_trip_generated(values: list[str]) -> None:
    argv = ["f", *values]
    text = format_command(argv, "bash")
    assert _run("bash", text) == [v.encode() for v in values]
    assert not any(c in text for c in "\n\r\x1b")


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("program", ["A=b", "x+=1", "time", "if", "llama-server"])
def test_bash_runs_the_program_whatever_its_name(program: str, tmp_path: Path) -> None:
    """A program named like an assignment or a reserved word is quoted: bash runs it."""
    exe = tmp_path / program
    exe.write_text("#!/bin/sh\nfor a; do printf '%s\\0' \"$a\"; done\n")
    exe.chmod(0o755)
    text = format_command([program, "-m", "x y", "-c", "1"], "bash")
    out = subprocess.run(["bash", "-c", text], capture_output=True, timeout=20, check=True,
                         env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    assert out.stdout.split(b"\0")[:-1] == [b"-m", b"x y", b"-c", b"1"]


def test_sh_gives_back_printable_hostile_arguments() -> None:
    """Without control characters the bash form is plain POSIX quoting: sh (dash here) reads it."""
    plain = [h for h in HOSTILE if h.isprintable() and "\udcff" not in h]
    argv = ["f", *plain]
    assert _run("sh", format_command(argv, "bash")) == [a.encode() for a in plain]


def test_nul_is_refused_naming_the_argument() -> None:
    for style in ("bash", "powershell", "cmd", "llama-swap", "docker-env"):
        with pytest.raises(ExportRefused, match=r"argument 2 'a\\x00b', the value of '-m'.*NUL"):
            format_command(["llama-server", "-m", "a\0b"], style)


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "\x1b[2J"])
def test_cmd_refuses_a_control_character(value: str) -> None:
    with pytest.raises(ExportRefused, match=r"cmd.exe: argument 2 .*the value of '-m'.*control character"):
        format_command(["llama-server", "-m", value], "cmd")


@pytest.mark.parametrize("argv", [["s", "-m", "%PATH%"], ["s", "-m", "50%", "-a", "x%y"]])
def test_cmd_refuses_percent_pairs(argv: list[str]) -> None:
    with pytest.raises(ExportRefused, match=r"cmd.exe: argument 2 '[^']*%[^']*', the value of '-m'.*%NAME%"):
        format_command(argv, "cmd")


def test_cmd_refuses_a_line_cmd_cannot_read() -> None:
    with pytest.raises(ExportRefused, match=r"cmd.exe reads no line longer than 8,191"):
        format_command(["s", "-m", "x" * 9000], "cmd")
    assert format_command(["s", "-m", "x" * 8000], "cmd").endswith("x")


def test_powershell_doubles_typographic_single_quotes() -> None:
    """PowerShell ends a '...' string at ' ‘ ’ ‚ ‛ alike; each is doubled inside one."""
    assert format_command(["s", "-m", "it\u2019s; rm x"], "powershell") == "s -m 'it\u2019\u2019s; rm x'"
    doubled = "s -m '\u2018\u2018\u201a\u201a\u201b\u201b'"
    assert format_command(["s", "-m", "\u2018\u201a\u201b"], "powershell") == doubled


def test_powershell_quotes_a_dash_word_it_would_split() -> None:
    """PowerShell passes a bare -a.b to a program as -a and .b (PowerShell issue #6291)."""
    argv = ["s", "-m", "-model.gguf", "--alias", "-v:diag", "-c", "-1", "-ts", "3,1"]
    assert format_command(argv, "powershell") == "s -m '-model.gguf' --alias '-v:diag' -c -1 -ts '3,1'"


def test_powershell_refuses_what_windows_cannot_start() -> None:
    with pytest.raises(ExportRefused, match=r"PowerShell: the program's command line would be"):
        format_command(["s", "-m", "x" * 40000], "powershell")
    with pytest.raises(ExportRefused, match=r"PowerShell: argument 2 '/m/\\xff.gguf'.*not UTF-8"):
        format_command(["s", "-m", os.fsdecode(b"/m/\xff.gguf")], "powershell")


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "\x1b[2J", "a\x85b", "a\u2028b"])
def test_llama_swap_refuses_a_control_character(value: str) -> None:
    with pytest.raises(ExportRefused, match=r"llama-swap: argument 2 .*the value of '-m'.*control character"):
        format_command(["llama-server", "-m", value], "llama-swap")


@pytest.mark.parametrize("value", ["${PORT}", "/m/${env.HOME}/x", "${MODEL_ID}"])
def test_llama_swap_refuses_its_macros(value: str) -> None:
    with pytest.raises(ExportRefused, match=r"llama-swap: argument 2 .*replaces \$\{"):
        format_command(["llama-server", "-m", value], "llama-swap")
    with pytest.raises(ExportRefused, match=r"llama-swap: the model name"):
        format_command(["llama-server", "-m", "m.gguf"], "llama-swap", name=value)


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
def test_llama_swap_round_trip_with_hostile_printable_values() -> None:
    yaml = pytest.importorskip("yaml")
    plain = [h for h in HOSTILE if h.isprintable() and "\udcff" not in h and "${" not in h]
    argv = ["f", "--port", "1", *plain]
    text = format_command(argv, "llama-swap", name="n")
    cmd = yaml.safe_load(text)["models"]["n"]["cmd"]
    got = _run("sh", cmd.replace("\n", " ").replace("${PORT}", "9999"))
    assert got == [a.encode() for a in ["--port", "9999", *plain]]


@pytest.mark.parametrize("name", ["\U0001f642 model", "modèle \"x\" \\ y", "Qwen3-30B-A3B"])
def test_llama_swap_model_name_reads_back(name: str) -> None:
    """The entry's name is a YAML double-quoted key: a character outside the BMP was written as a
    JSON surrogate pair, which YAML reads as two lone surrogates (Go's yaml refuses it)."""
    yaml = pytest.importorskip("yaml")
    text = format_command(["llama-server", "-m", "m.gguf"], "llama-swap", name=name)
    assert list(yaml.safe_load(text)["models"]) == [name]


def _read_env_file(text: str) -> tuple[dict[str, str], list[str]]:
    """docker's --env-file rules (docker/cli opts/file.go): one VAR=value a line, '#' lines skipped,
    the value taken as it is (no quotes, no escapes), a trailing CR dropped, UTF-8 only."""
    env: dict[str, str] = {}
    command = ""
    for line in text.encode().split(b"\n"):
        assert len(line) < 64 * 1024
        s = line.decode("utf-8").removesuffix("\r").lstrip()
        if s.startswith("# command"):
            command = s.split(": ", 1)[1]
        if s and not s.startswith("#"):
            key, _, value = s.partition("=")
            assert key.isidentifier(), key
            env[key] = value
    return env, [a.decode() for a in _run("bash", "f " + command)] if command else []


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("value", [h for h in HOSTILE if "\udcff" not in h] + ["x\nLLAMA_ARG_HOST=0.0.0.0"],
                         ids=lambda v: ascii(v)[:24])
def test_docker_env_carries_or_keeps_on_argv(value: str) -> None:
    argv = ["llama-server", "-m", value, "--api-key", value, "-c", "4096"]
    env, rest = _read_env_file(format_command(argv, "docker-env"))
    assert env.get("LLAMA_ARG_HOST") is None  # nothing in a value becomes a variable of its own
    got_model = env.get("LLAMA_ARG_MODEL")
    if got_model is None:
        assert rest[:2] == ["-m", value]
    else:
        assert got_model == value and "\x1b" not in got_model and "\r" not in got_model
    assert env["LLAMA_ARG_CTX_SIZE"] == "4096"


def test_docker_env_keeps_a_long_value_on_argv() -> None:
    text = format_command(["llama-server", "-m", "m" * 70000, "-c", "1"], "docker-env")
    assert all(len(line) < 64 * 1024 for line in text.splitlines()[:-1])
    assert "LLAMA_ARG_MODEL" not in text and "LLAMA_ARG_CTX_SIZE=1" in text


def test_docker_env_refuses_an_override_list_docker_cannot_read() -> None:
    ots = [t for i in range(3) for t in ("-ot", f"{i}{'x' * 30000}=CPU")]
    with pytest.raises(ExportRefused, match=r"LLAMA_ARG_OVERRIDE_TENSOR would be a .*-byte line"):
        format_command(["llama-server", *ots], "docker-env")


def test_ordinary_arguments_unchanged() -> None:
    argv = ["llama-server", "-m", "/m/x y.gguf", "-ot", "blk\\.0\\.=CPU", "-c", "8192"]
    assert format_command(argv, "bash") == "llama-server -m '/m/x y.gguf' -ot 'blk\\.0\\.=CPU' -c 8192"
    assert format_command(argv, "powershell") == "llama-server -m '/m/x y.gguf' -ot blk\\.0\\.=CPU -c 8192"
    assert format_command(argv, "cmd") == 'llama-server -m "/m/x y.gguf" -ot blk\\.0\\.=CPU -c 8192'


@pytest.mark.parametrize("multiline", [False, True])
def test_pasting_the_bash_export_back_gives_the_same_arguments(multiline: bool) -> None:
    """Paste command… reads bash's $'...' the way bash does (the export writes control characters so)."""
    argv = ["llama-server", *HOSTILE, "$'not\\nansi' stays", "a$'b'c"]
    assert split_command_text(format_command(argv, "bash", multiline=multiline)) == argv
    pasted = "x $'\\x41\\101\\u00e9\\E\\'q' \"$'no'\" '$'\\''lit'"
    assert split_command_text(pasted) == ["x", "AAé\x1b'q", "$'no'", "$'lit"]



def test_bash_ansi_c_strings_hold_no_quote_or_bang() -> None:
    """A history expansion that does not know $'...' ends it at \\' and expands a later !."""
    text = format_command(["f", "it's\n!ls!"], "bash")
    assert text == "f $'it\\x27s\\n\\x21ls\\x21'"
    assert _run("bash", text) == [b"it's\n!ls!"]


_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=10)


@pytest.mark.skipif(shutil.which("sh") is None, reason="no sh")
@settings(max_examples=40, deadline=None)
@given(st.lists(_TEXT, max_size=4))
def test_llama_swap_generated_is_exact_or_refused(values: list[str]) -> None:
    yaml = pytest.importorskip("yaml")
    argv = ["f", "--port", "1", "--api-key", *values]
    try:
        text = format_command(argv, "llama-swap", name="n")
    except ExportRefused as e:
        assert "llama-swap: argument " in str(e)
        return
    cmd = yaml.safe_load(text)["models"]["n"]["cmd"]
    assert _run("sh", cmd.replace("\n", " ").replace("${PORT}", "9")) == [
        a.encode() for a in ["--port", "9", "--api-key", *values]]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@settings(max_examples=40, deadline=None)
@given(_TEXT, _TEXT)
def test_docker_env_generated_is_exact(model: str, key: str) -> None:
    argv = ["llama-server", "-m", model, "--api-key", key, "-c", "8"]
    env, rest = _read_env_file(format_command(argv, "docker-env"))
    assert env.get("LLAMA_ARG_MODEL", model) == model and env["LLAMA_ARG_CTX_SIZE"] == "8"
    expected_rest = [] if "LLAMA_ARG_MODEL" in env else ["-m", model]
    expected_rest += [] if "LLAMA_API_KEY" in env else ["--api-key", key]
    assert rest == expected_rest
    if "LLAMA_API_KEY" in env:
        assert env["LLAMA_API_KEY"] == key
