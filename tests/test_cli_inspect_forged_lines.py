"""A string from the file with a line break (general.name, general.architecture, a tensor name) printed
raw by `inspect`: its text report kept newlines (it is several lines), so a downloaded model could print
a line of its own making ('note: checked by offload-planner: safe')."""

from __future__ import annotations

from pathlib import Path

from tests.core.test_reader_bad_input import F32_T, Raw, _with_kv, kv_str, tinfo
from tests.test_cli_plan_input import run


def test_a_line_break_in_the_files_strings_is_escaped(tmp_path: Path) -> None:
    raw = _with_kv(Raw(), kv_str("general.name", "Evil\nnote: checked by offload-planner: safe"))
    raw.infos[2] = tinfo("output_norm\n.weight", [32], F32_T, 352)
    path = raw.write(tmp_path / "name.gguf")
    r = run("inspect", str(path), env={"XDG_CONFIG_HOME": str(tmp_path / "cfg")})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "Evil\\nnote: checked by offload-planner: safe"
    assert not any(ln.startswith("note: checked") or ln.startswith(".weight") for ln in lines), r.stdout
    assert any("output_norm\\n.weight" in ln for ln in lines), r.stdout


def test_an_architecture_with_a_line_break_and_an_escape_is_escaped(tmp_path: Path) -> None:
    """`inspect` printed load_error's note raw (the ESC reached the terminal, the line break made a line);
    `plan`'s error kept the line break ('key not found in model: ev\\x1bil' then 'note: fine...')."""
    from tests.core.test_reader_bad_input import kv_u32

    arch = "ev\x1bil\nnote: fine"
    raw = Raw(kvs=[kv_str("general.architecture", arch), kv_u32(f"{arch}.block_count", 1)])
    path = raw.write(tmp_path / "arch.gguf")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    r = run("inspect", str(path), env=env)
    assert r.returncode == 0 and "\x1b" not in r.stdout, r.stdout
    assert not any(ln.startswith("note: fine") for ln in r.stdout.splitlines()), r.stdout
    assert "note: key not found in model: ev\\x1bil\\nnote: fine.context_length" in r.stdout
    r = run("plan", str(path), "--no-detect", env=env)
    assert r.returncode == 2 and "\x1b" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
