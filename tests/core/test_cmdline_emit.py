"""format_command / args_to_env: every display format gives back the same argv (or settings)."""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import subprocess

import pytest

from offload_planner.core.cmdline import (
    Dialect,
    ServerArgs,
    args_to_env,
    flag_table,
    format_command,
    parse_server_args,
)

ARGVS: list[list[str]] = [
    ["llama-server", "-m", "/models/x.gguf", "-ngl", "999", "-c", "8192"],
    [
        "/opt/llama cpp/llama-server",
        "-m",
        "C:\\Models\\GLM 4.5\\model.gguf",
        "-ot",
        "blk\\.(1|2|3)\\.ffn_.*_exps\\.weight$=CPU",
        "-ot",
        "token_embd=CUDA0",
        "--api-key",
        'it\'s "quoted" & |piped|',
        "--chat-template-kwargs",
        '{"enable_thinking": false}',
        "-ts",
        "3,1",
        "-a",
        "",
        "--alias",
        "%PATH% $HOME `x`",
    ],
    ["llama-server", "-ot", 'a\\\\"b=CPU', "--prompt-cache", "trailing\\", "--x", "tab\there", "-c", "-1"],
    ["llama-server", "-ot", "^blk\\.0\\.(attn|ffn)_.*=CPU", "--lora", "a!b(c)d<e>f^g;h,i=j", "-n", "-2"],
]


def _shell_cases() -> list[list[str]]:
    return ARGVS


@pytest.mark.parametrize("argv", _shell_cases())
@pytest.mark.parametrize("multiline", [False, True])
def test_bash_round_trip_with_shlex(argv: list[str], multiline: bool) -> None:
    text = format_command(argv, "bash", multiline=multiline)
    assert shlex.split(text.replace("\\\n", " ")) == argv


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_round_trip_with_real_bash() -> None:
    script = "f() { printf '%s\\0' \"$@\"; }\n"
    for argv in ARGVS:
        for multiline in (False, True):
            text = format_command(["f", *argv[1:]], "bash", multiline=multiline)
            out = subprocess.run(["bash", "-c", script + text], capture_output=True, timeout=10, check=True)
            assert out.stdout.decode().split("\0")[:-1] == argv[1:]


def test_bash_quotes_only_where_needed() -> None:
    assert format_command(["llama-server", "-m", "/m/x.gguf", "-ts", "3,1", "-c", "8192"], "bash") == (
        "llama-server -m /m/x.gguf -ts 3,1 -c 8192"
    )
    assert format_command(["llama-server", "-ot", "exps=CPU", "-ot", "blk\\.0\\.=CPU"], "bash") == (
        "llama-server -ot exps=CPU -ot 'blk\\.0\\.=CPU'"
    )
    multi = format_command(["llama-server", "-m", "x.gguf", "-fa", "on", "--jinja"], "bash", multiline=True)
    assert multi == "llama-server \\\n  -m x.gguf \\\n  -fa on \\\n  --jinja"


LEGACY_BLOCK = "& { $PSNativeCommandArgumentPassing = 'Legacy'; "


def _powershell_split(text: str) -> list[str]:
    """PowerShell's reading of what we emit: bare words and '...' strings ('' is a quote)."""
    text = text.replace(" `\n", " ")
    if text.startswith(LEGACY_BLOCK):
        assert text.endswith(" }")
        text = text.removeprefix(LEGACY_BLOCK).removesuffix(" }")
    if text.startswith("& "):
        text = text[2:]
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == " ":
            i += 1
            continue
        if text[i] == "'":
            j, buf = i + 1, []
            while True:
                if text[j] == "'" and text[j + 1 : j + 2] == "'":
                    buf.append("'")
                    j += 2
                elif text[j] == "'":
                    break
                else:
                    buf.append(text[j])
                    j += 1
            out.append("".join(buf))
            i = j + 1
        else:
            j = text.find(" ", i)
            j = len(text) if j < 0 else j
            word = text[i:j]
            assert not any(c in word for c in "'\"$`,;(){}@#|&<>"), word
            out.append(word)
            i = j
    return out


def _need_quotes(arg: str) -> bool:
    """PowerShell's ``NeedQuotes`` (NativeCommandParameterBinder.cs, Windows PowerShell 5.1 to 7.2, and
    7.3+ with $PSNativeCommandArgumentPassing = 'Legacy'): whitespace outside its count of quotes,
    where a quote right after a backslash is not counted."""
    count, after_backslash = 0, False
    for ch in arg:
        if ch == '"' and not after_backslash:
            count += 1
        elif ch.isspace() and count % 2 == 0:
            return True
        after_backslash = ch == "\\"
    return False


def _legacy_line(tokens: list[str], *, double_trailing_backslashes: bool) -> str:
    """The command line the legacy passing builds: an empty argument dropped, one that needs quotes
    wrapped in ``"`` (PowerShell 6.0-7.2 double its trailing backslashes first; 5.1 does not)."""
    out = []
    for t in tokens:
        if not t:
            continue
        if _need_quotes(t):
            tail = len(t) - len(t.rstrip("\\"))
            t = '"' + t + ("\\" * tail if double_trailing_backslashes else "") + '"'
        out.append(t)
    return " ".join(out)


def _program_receives(text: str, version: str) -> list[str]:
    """The arguments llama-server.exe gets from the PowerShell command ``text`` (after the program)."""
    tokens = _powershell_split(text)[1:]
    if version == "7.3" and not text.startswith(LEGACY_BLOCK):
        return tokens  # Standard passing: each argument exact
    return _argv_w(_legacy_line(tokens, double_trailing_backslashes=version == "7.2"))


@pytest.mark.parametrize("argv", ARGVS)
@pytest.mark.parametrize("multiline", [False, True])
def test_powershell_round_trip(argv: list[str], multiline: bool) -> None:
    text = format_command(argv, "powershell", multiline=multiline)
    for version in ("5.1", "7.2", "7.3"):
        assert _program_receives(text, version) == argv[1:], version
    if " " in argv[0]:
        assert (LEGACY_BLOCK + "& '" if text.startswith(LEGACY_BLOCK) else "& '") in text


def test_powershell_uses_the_legacy_block_only_for_arguments_51_would_change() -> None:
    plain = format_command(["llama-server", "-m", "C:\\my models\\m.gguf", "-ot", "exps=CPU"], "powershell")
    assert plain == "llama-server -m 'C:\\my models\\m.gguf' -ot exps=CPU"
    for arg in ("", 'a"b', "C:\\my models\\"):
        text = format_command(["llama-server", "-m", "m.gguf", "--alias", arg], "powershell")
        assert text.startswith(LEGACY_BLOCK) and text.endswith(" }"), text


def _cmd_then_argv(text: str) -> list[str]:
    """cmd.exe (a leading REM line is a command of its own that does nothing; ^ escapes outside double
    quotes) then CommandLineToArgvW's rules."""
    if text.startswith("REM "):
        rem, _, text = text.partition("\n")
        assert not any(c in rem for c in "%!^&|<>\""), rem
    text = text.replace(" ^\n", " ")
    line, in_q, i = [], False, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            in_q = not in_q
        elif c == "^" and not in_q:
            i += 1
            c = text[i]
        line.append(c)
        i += 1
    return _argv_w("".join(line))


def _argv_w(s: str) -> list[str]:
    """CommandLineToArgvW's rules (for the arguments after the program)."""
    args: list[str] = []
    i, cur, in_q, started = 0, [], False, False
    while i <= len(s):
        c = s[i] if i < len(s) else None
        if c is None or (c in " \t" and not in_q):
            if started:
                args.append("".join(cur))
            cur, started = [], False
            i += 1
            continue
        started = True
        if c == "\\":
            n = 0
            while i < len(s) and s[i] == "\\":
                n += 1
                i += 1
            if i < len(s) and s[i] == '"':
                cur.append("\\" * (n // 2))
                if n % 2:
                    cur.append('"')
                    i += 1
            else:
                cur.append("\\" * n)
            continue
        if c == '"':
            in_q = not in_q
        else:
            cur.append(c)
        i += 1
    return args


def _cmd_cases() -> list[list[str]]:
    """ARGVS with one '%' where they have '%PATH%': real cmd.exe replaces %PATH% inside double
    quotes too, so that argv is refused (tests/core/test_export_hostile.py), not carried."""
    return [[a.replace("%PATH%", "50%") for a in argv] for argv in ARGVS]


@pytest.mark.parametrize("argv", _cmd_cases())
@pytest.mark.parametrize("multiline", [False, True])
def test_cmd_round_trip(argv: list[str], multiline: bool) -> None:
    assert _cmd_then_argv(format_command(argv, "cmd", multiline=multiline)) == argv


def test_cmd_says_which_argument_delayed_expansion_would_change() -> None:
    """``!`` is literal in cmd.exe as it starts, but with delayed expansion on (cmd /v:on, setlocal
    EnableDelayedExpansion) ``!NAME!`` is replaced and a lone ``!`` dropped even inside double quotes."""
    text = format_command(["s", "-m", "m.gguf", "-ot", "blk\\.(?!0\\.).*=CPU"], "cmd", multiline=True)
    rem, _, command = text.partition("\n")
    assert rem.startswith("REM for cmd.exe with delayed expansion off, its default") and "argument 4" in rem
    assert command == 's ^\n  -m m.gguf ^\n  -ot "blk\\.(?!0\\.).*=CPU"'
    assert not format_command(["s", "-m", "m.gguf"], "cmd").startswith("REM")


def test_cmd_escapes_metacharacters_cmd_sees() -> None:
    assert format_command(["s", "-ot", "a|b=CPU"], "cmd") == 's -ot "a|b=CPU"'
    # the escaped quote leaves cmd outside quotes: & is escaped, and the closing quote is ^" so that cmd
    # is outside quotes for the next argument too (tests/core/test_export_cmd_quotes.py)
    assert format_command(["s", "--api-key", 'a"b&c'], "cmd") == 's --api-key "a\\"b^&c^"'


def test_llama_swap_entry() -> None:
    argv = [
        "/opt/llama-server",
        "-m",
        "/models/Qwen3-30B-A3B-Q4_K_M.gguf",
        "--port",
        "8080",
        "-ot",
        "exps=CPU",
        "-ot",
        "blk\\.(0|1)\\.=CUDA0",
    ]
    text = format_command(argv, "llama-swap")
    assert text.startswith('models:\n  "Qwen3-30B-A3B-Q4_K_M":\n    cmd: |\n')
    assert "      --port ${PORT}\n" in text
    no_port = format_command(["llama-server", "-m", "m.gguf", "-a", "my model"], "llama-swap")
    assert '  "my model":' in no_port and "      --port ${PORT}\n" in no_port
    yaml = pytest.importorskip("yaml")
    cmd = yaml.safe_load(text)["models"]["Qwen3-30B-A3B-Q4_K_M"]["cmd"]
    # llama-swap joins the lines, substitutes ${PORT}, then splits like a shell
    assert shlex.split(cmd.replace("\n", " ").replace("${PORT}", "9999")) == [*argv[:4], "9999", *argv[5:]]


def _comparable(args: ServerArgs) -> dict[str, object]:
    d = dataclasses.asdict(args)
    d["overrides"] = [(o["pattern"], o["buft"], o["source"]) for o in d["overrides"]]
    d["draft"].pop("env")  # the variables the parse read (ik gives them to -draft's ARGS): the form's input
    return d


def test_ik_with_draft_params_keeps_every_flag_on_argv() -> None:
    """ik's -draft "ARGS" is parsed after the LLAMA_ARG_* variables are applied again to the draft's copy
    of the main settings: -ngl moved to LLAMA_ARG_N_GPU_LAYERS would replace the draft's -ngld."""
    argv = ["llama-server", "-m", "x", "-ngl", "99", "-md", "d", "-ngld", "0", "-draft", "-b 64"]
    env, rest = _docker_round_trip(argv, Dialect.IK)
    assert env == {} and rest == argv[1:]


def _docker_round_trip(argv: list[str], dialect: Dialect) -> tuple[dict[str, str], list[str]]:
    text = format_command(argv, "docker-env", dialect=dialect)
    env: dict[str, str] = {}
    rest: list[str] = []
    for line in text.splitlines():
        if line.startswith("# command"):
            rest = shlex.split(line.split(": ", 1)[1])
        elif not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env, rest


@pytest.mark.parametrize(
    ("argv", "dialect", "moved"),
    [
        (
            [
                "llama-server",
                "-m",
                "/m/x.gguf",
                "-ngl",
                "all",
                "-c",
                "8192",
                "-fa",
                "on",
                "-ctk",
                "q8_0",
                "-nkvo",
                "--no-host",
                "-kvu",
                "-ot",
                "a=CPU",
                "-ot",
                "b=CUDA0",
                "--cpu-moe",
                "--jinja",
                "--temp",
                "0.6",
                "-lm",
                "none",
                "--control-vector-layer-range",
                "1",
                "3",
            ],
            Dialect.LLAMA_CPP,
            {
                "LLAMA_ARG_MODEL",
                "LLAMA_ARG_N_GPU_LAYERS",
                "LLAMA_ARG_OVERRIDE_TENSOR",
                "LLAMA_ARG_CPU_MOE",
                "LLAMA_ARG_KV_OFFLOAD",
                "LLAMA_ARG_NO_HOST",
            },
        ),
        # --cpu-moe before -ot: the environment would apply -ot first, so the overrides stay on argv
        (
            ["llama-server", "--cpu-moe", "-ot", "a=CUDA0", "-c", "4096"],
            Dialect.LLAMA_CPP,
            {"LLAMA_ARG_CTX_SIZE"},
        ),
        (["llama-server", "-ot", "a=CPU", "--n-cpu-moe", "2", "-ot", "b=CPU"], Dialect.LLAMA_CPP, set()),
        (["llama-server", "-c", "1", "-c", "2", "-fa"], Dialect.LLAMA_CPP_2025, {"LLAMA_ARG_FLASH_ATTN"}),
        (
            ["llama-server", "--no-mmap", "--mlock", "-ngl", "40"],
            Dialect.LLAMA_CPP_2025,
            {"LLAMA_ARG_MMAP", "LLAMA_ARG_MLOCK", "LLAMA_ARG_N_GPU_LAYERS"},
        ),
        (
            ["llama-server", "-m", "x", "-fa", "off", "-ot", "a=CPU", "-mla", "3", "--mlock", "-no-fa"],
            Dialect.IK,
            {"LLAMA_ARG_MODEL", "LLAMA_ARG_MLOCK"},
        ),
    ],
)
def test_docker_env_means_the_same(argv: list[str], dialect: Dialect, moved: set[str]) -> None:
    env, rest = _docker_round_trip(argv, dialect)
    assert moved <= set(env)
    original = parse_server_args(argv, dialect=dialect)
    again = parse_server_args(rest, dialect=dialect, env=env)
    assert _comparable(again.args) == _comparable(original.args)
    # passthrough flags either stay on argv or their variable carries them
    table = flag_table(dialect)
    for use in original.flags:
        spec = table.by_key(use.key)
        assert spec is not None
        if use.spelling in original.passthrough and use.spelling not in again.passthrough:
            assert spec.env in env


def test_args_to_env_values() -> None:
    split = args_to_env(["-nkvo", "--repack", "-ot", "a=CPU", "-ot", "b=CPU", "--multiline", "x\ny"])
    assert split.env == {
        "LLAMA_ARG_KV_OFFLOAD": "0",
        "LLAMA_ARG_REPACK": "1",
        "LLAMA_ARG_OVERRIDE_TENSOR": "a=CPU,b=CPU",
    }
    assert split.rest == ["--multiline", "x\ny"]


def test_unknown_style_is_refused() -> None:
    with pytest.raises(ValueError):
        format_command(["llama-server"], "fish")
