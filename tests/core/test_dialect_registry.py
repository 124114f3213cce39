"""A fourth dialect is one module: a newer llama.cpp build, written here as a subclass of the pinned
one and registered by this test, is picked up by the parser, the plan, the exported command, plan
files and the ``plan`` command without any other module knowing its name."""

from __future__ import annotations

import copy
import json
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from offload_planner.cli import main
from offload_planner.core.cmdline import detect_dialect, parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.dialects import (
    IK,
    LLAMA_CPP,
    LLAMA_CPP_2025,
    Dialect,
    all_dialects,
    dialect_named,
    register,
    unregister,
)
from offload_planner.core.dialects.mainline import PinnedMainline
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.plan import plan_command, plan_from_args
from offload_planner.core.plan_file import PlanFile, load_plan, save_plan

ROOT = Path(__file__).resolve().parents[2]
QWEN = str(ROOT / "resources" / "Qwen3-30B-A3B-Q4_K_M.header.gguf")  # 48 layers, 128 experts
NAME = "llama.cpp-b9000"


class Build9000(PinnedMainline):
    """An imagined later build: the pinned flags, but one slot by default (no 4-slot auto), no
    ``--fit`` on by default, and ``-fa`` renamed away."""

    auto_parallel = False
    fits_by_default = False
    detect_rank = 15  # before the 2025 builds, whose version line has the same form
    help_markers = (r"--b9000-only-flag",)
    version_markers = (r"(?m)^version:\s*9\d{3}\s*\(",)

    def moved_flags(self) -> Mapping[str, str]:
        return {**super().moved_flags(), "--flash-attn-old": "-fa on"}


@pytest.fixture
def b9000() -> Iterator[Dialect]:
    d = register(Build9000(NAME, "llama.cpp (build 9000)"))
    try:
        yield d
    finally:
        unregister(d)


def _devices() -> DeviceSet:
    """One 24 GiB CUDA GPU and 512 GiB of RAM, as ``--device CUDA0=24GiB --device CPU=512GiB``."""
    return DeviceSet(parse_device_decl("CPU=512GiB"), (parse_device_decl("CUDA0=24GiB"),))


def test_registered_by_name_and_listed(b9000: Dialect) -> None:
    assert Dialect(NAME) is b9000 and dialect_named(NAME) is b9000
    assert b9000 == NAME and b9000.label == "llama.cpp (build 9000)"
    assert [d.value for d in Dialect] == ["llama.cpp", "llama.cpp-2025", "llama.cpp-2025-early",
                                         "ik_llama.cpp", "ik_llama.cpp-2026-08", "ik_llama.cpp-2025",
                                         "ik_llama.cpp-2025-05", NAME]
    assert all_dialects()[0] is LLAMA_CPP


def test_a_dialect_is_its_name_when_copied_pickled_or_written() -> None:
    # plans are deep-copied (dataclasses.asdict) and written as JSON: the object must survive both
    assert copy.deepcopy(IK) is IK and pickle.loads(pickle.dumps(LLAMA_CPP_2025)) is LLAMA_CPP_2025
    assert json.dumps({"dialect": IK}) == '{"dialect": "ik_llama.cpp"}' and f"{LLAMA_CPP}" == "llama.cpp"
    assert repr(IK) == "'ik_llama.cpp'" and IK.value == "ik_llama.cpp" and type(IK.value) is str


def test_unregistered_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=f"'{NAME}' is not a known dialect"):
        Dialect(NAME)


def test_recognised_from_its_output(b9000: Dialect) -> None:
    assert detect_dialect("version: 9001 (0badc0de)", "") is b9000
    assert detect_dialect("", "  --b9000-only-flag N   something new") is b9000
    # the others are still told apart as before
    assert detect_dialect("version: 6123 (abcdef0)", "") is LLAMA_CPP_2025
    assert detect_dialect("version: 9001 (0badc0de)", "--mla-use") is IK


def test_parser_uses_its_flag_table_and_hints(b9000: Dialect) -> None:
    argv = ["llama-server", "-c", "4096", "-lm", "none", "--flash-attn-old"]
    parsed = parse_server_args(argv, dialect=b9000)
    assert parsed.dialect is b9000
    assert parsed.args.ctx_size == 4096 and parsed.args.load_mode == "none"  # the pinned flags it inherits
    assert [e.flag for e in parsed.errors] == ["--flash-attn-old"]
    assert "use -fa on" in parsed.errors[0].explanation


def test_plan_and_command_follow_its_defaults(b9000: Dialect) -> None:
    model = open_model(QWEN)
    devices = _devices()
    args = ["-c", "4096", "-ngl", "99"]
    mine = plan_from_args(model, devices, parse_server_args(args, dialect=b9000), b9000)
    pinned = plan_from_args(model, devices, parse_server_args(args, dialect=LLAMA_CPP), LLAMA_CPP)
    assert mine.dialect is b9000 and mine.context.dialect is b9000
    # one slot instead of the pinned server's 4 slots with a unified KV cache
    assert (mine.context.n_seq_max, mine.context.kv_unified) == (1, False)
    assert (pinned.context.n_seq_max, pinned.context.kv_unified) == (4, True)
    assert mine.placement_options.output_first  # inherited: the output layer is offloaded first
    cmd, ref = plan_command(mine), plan_command(pinned)
    assert "-fit" not in cmd and ref[-2:] == ["-fit", "off"]
    assert cmd[cmd.index("-np") + 1] == "1" and "-np" not in ref
    # the projection asks the dialect too: the logits buffer holds one sequence, not four
    out = {b.kind: b for m in mine.projection().devices for b in m.buffers}["output"]
    ref_out = {b.kind: b for m in pinned.projection().devices for b in m.buffers}["output"]
    assert out.bytes * 4 == ref_out.bytes == 4 * 4 * model.summary.n_vocab


def test_plan_file_keeps_it(b9000: Dialect, tmp_path: Path) -> None:
    model = open_model(QWEN)
    plan = plan_from_args(model, _devices(), parse_server_args(["-c", "4096"], dialect=b9000), b9000)
    path = tmp_path / "b9000.json"
    save_plan(path, PlanFile.of(plan))
    assert json.loads(path.read_text())["dialect"] == NAME
    assert load_plan(path).dialect is b9000
    unregister(b9000)
    with pytest.raises(Exception, match="dialect"):
        load_plan(path)  # a file of a dialect this planner does not know: refused, naming the field


def test_plan_command_takes_it_as_backend(b9000: Dialect, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", QWEN, "--json", "--backend", NAME, "--no-detect", "--device", "CUDA0=24GiB",
                 "--device", "CPU=512GiB", "--", "-c", "4096"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["command"] == ["-m", QWEN, "-c", "4096", "-ngl", "999", "-np", "1", "-fa", "on"]
    assert out["fit"] is None  # --fit is the pinned build's default only
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert NAME in capsys.readouterr().out
