"""`fit`'s table names its candidates by how the search made them ("fastest (-ub 4096, own -ts,
parts)", "..., speculative", "from llama.cpp --fit, split layers"); those words explained nothing
where the table is read.  Under the table each word used is explained in one line, as its ``~`` is,
and no word that is not used."""

from __future__ import annotations

import re

import pytest
from tests.test_cli_plan_input import ROOT, run

from offload_planner.core.synth import write_model
from offload_planner.core.synth.catalog import BIG_MODELS

DEMO = str(ROOT / "resources" / "DeepSeek-V3-Q4_K_M.header.gguf")
HOST = ("--no-detect", "--device", "CPU=512GiB,ram=8xDDR5-4800")
TERMS = ("own -ts", "small layers first", "parts", "speculative", "split layers")


@pytest.fixture(scope="module")
def glm_air(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("glm") / "glm-air.header.gguf"
    [path] = write_model(BIG_MODELS["GLM-4.5-Air-Q4_K_M"], out, header_only=True)
    return str(path)


def _table_and_legend(out: str) -> tuple[list[str], dict[str, str]]:
    lines = out.splitlines()
    start = lines.index(next(x for x in lines if x.startswith("candidate")))
    rows = []
    for x in lines[start + 1:]:
        if not re.match(r"[ *]\S", x):
            break
        rows.append(x)
    after = lines[start + 1 + len(rows):lines.index("")]
    legend = dict(x.split(": ", 1) for x in after if not x.startswith(("~:", "note:", "balanced:")))
    return rows, legend


def _words(rows: list[str]) -> set[str]:
    """The words between a label's parentheses, and "again" after them."""
    words = {w.strip() for r in rows for m in re.findall(r"^.fastest \(([^)]*)\)", r) for w in m.split(",")}
    return words | ({"again"} if any(re.match(r".fastest \([^)]*\) again\b", r) for r in rows) else set())


@pytest.mark.parametrize("case", ["two 3090", "one A100", "GLM MTP on three 3060"])
def test_every_word_of_a_candidate_label_is_explained_under_the_table(case: str, glm_air: str) -> None:
    args = {
        "two 3090": (DEMO, "--device", "CUDA0=rtx3090", "--device", "CUDA1=rtx3090", "--", "-c", "32768"),
        "one A100": (DEMO, "--device", "CUDA0=a100-80gb", "--goal", "tg", "--", "-c", "32768"),
        "GLM MTP on three 3060": (glm_air, "--device", "CUDA0=rtx3060", "--device", "CUDA1=rtx3060",
                                  "--device", "CUDA2=rtx3060", "--goal", "tg", "--",
                                  "-c", "16384", "--spec-type", "draft-mtp"),
    }[case]
    r = run("fit", *HOST, *args)
    assert r.returncode == 0, r.stderr
    rows, legend = _table_and_legend(r.stdout)
    words = _words(rows) - {w for w in _words(rows) if w.startswith("-ub ")}
    assert words & set(TERMS), rows  # the case shows some of them
    assert set(legend) == words, (legend, words)  # each used word once, nothing else
    for w in words:
        if w.startswith("from "):  # a start from a baseline: its row is in the table
            assert any(row[1:].startswith(w.removeprefix("from ") + " ") for row in rows), (w, rows)
    expect = {"two 3090": {"own -ts", "parts", "split layers"},
              "one A100": {"small layers first", "parts", "split layers"},
              "GLM MTP on three 3060": {"own -ts", "parts", "speculative", "split layers"}}[case]
    assert expect <= words


def test_a_layout_made_again_is_told_apart_from_the_first(glm_air: str) -> None:
    """GLM-4.5-Air with MTP on three RTX 3060: the search's second round (after a full projection
    found its first answer over) kept the first round's labels, so the table listed "fastest (-ub 512)"
    twice (over, then fitting) and one label three times with other figures, and the JSON's ``best``
    named a label several candidates carried.  Later rows of a label say "again" (explained under the
    table); ``best`` names one candidate."""
    import json

    args = (*HOST, glm_air, "--device", "CUDA0=rtx3060", "--device", "CUDA1=rtx3060",
            "--device", "CUDA2=rtx3060", "--goal", "tg")
    server = ("--", "-c", "16384", "--spec-type", "draft-mtp")
    text = run("fit", *args, *server)
    assert text.returncode == 0, text.stderr
    rows, legend = _table_and_legend(text.stdout)
    labels = [re.split(r"\s{1,}(?:~?yes|~?no)\s", r[1:])[0].rstrip() for r in rows]
    assert len(set(labels)) == len(labels), labels
    assert any(lb.endswith(" again") for lb in labels) and "again" in legend
    out = json.loads(run("fit", *args, "--json", *server).stdout)
    cands = out["candidates"]
    assert [c["label"] for c in cands] == labels
    [best] = [c for c in cands if c["label"] == out["best"]]
    [starred] = [r for r in rows if r.startswith("*")]
    assert starred[1:].startswith(out["best"] + " ") and f"{best['tg_tps']:.2f}" in starred



def _nothing_fits(gpu: str, starts: str) -> tuple[list[str], int]:
    """``fit`` of DeepSeek-V3 on ``gpu`` with this machine's RAM (skipped where it holds the experts):
    the output's lines and the index of the line ``starts``, followed by the note that the RAM is
    this machine's and how to declare another's."""
    import psutil

    ram = psutil.virtual_memory().total
    if ram > 380 * 1024**3:
        pytest.skip("this machine's RAM holds the experts")
    r = run("fit", "--no-detect", DEMO, "--device", gpu, "--", "-c", "32768")
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    i = next(i for i, x in enumerate(lines) if x.startswith(starts))
    assert lines[i + 1] == (f"note: the RAM is this machine's ({ram / 1024**3:.1f} GiB); to plan for another "
                            "machine declare its RAM and its speed, e.g. --device CPU=512GiB,ram=8xDDR5-4800 "
                            "(channels x MT/s; else this machine's speed)")
    return lines, i

def test_nothing_fits_this_machines_ram_says_how_to_plan_for_another() -> None:
    """DeepSeek-V3 and one RTX 3090 on a machine with less RAM than its experts: "nothing fits these
    devices: CPU (RAM) over by 335.3 GiB (358.9 GiB projected > 23.5 GiB)", and no word that the RAM
    was this machine's and can be declared.  With the RAM declared, no such note."""
    _nothing_fits("CUDA0=rtx3090", "nothing fits these devices: CPU (RAM) over by")
    declared = run("fit", "--no-detect", DEMO, "--device", "CUDA0=rtx3090", "--device", "CPU=64GiB",
                   "--", "-c", "32768")
    assert declared.returncode == 1 and "nothing fits these devices: CPU (RAM)" in declared.stdout
    assert "the RAM is this machine's" not in declared.stdout


def test_the_ram_note_comes_when_a_gpu_is_over_as_well() -> None:
    """The note came only when the RAM was the first device over: a laptop planning DeepSeek-V3 for a
    small GPU read "nothing fits these devices: CUDA0 over by ...; CPU (RAM) over by 355 GiB (... >
    23.5 GiB)" and no word that the RAM was this machine's (newcomer4)."""
    lines, i = _nothing_fits("CUDA0=2GiB", "nothing fits these devices: CUDA0 over by")
    assert "; CPU (RAM) over by" in lines[i], lines[i]


def test_the_split_layers_legend_says_what_a_graph_split_is() -> None:
    """fit's legend read "(two more graph splits for each such layer)", a term a llama.cpp user does not
    read in its log; it says what one is, as plan --explain does."""
    from offload_planner.cli_fit import label_legend

    assert label_legend(["fastest (-ub 512, split layers)"]) == [
        "split layers: single expert tensors added from layers whose other experts stay on the CPU, in the "
        "room each GPU has left (two more graph splits, hand-overs between devices in a token's pass, for "
        "each such layer)"]
