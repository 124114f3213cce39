"""`offload-planner plan` prints exactly what it printed before the engine was reorganised.

The README's `plan` commands (and the `--backend ik_llama.cpp` and second-model variants) on the
bundled header-only models, as text, with `--explain` and as `--json`, compared byte for byte with
the files in ``tests/data/cli_plan/``.  Those files were written by the code as it stood before the
compute simulation was made incremental everywhere and split into a package (main at 9afbee4, with
``python tests/test_cli_plan_golden.py --write``); a change of output is a change of behaviour and
must be explained, not regenerated away.

Explained changes since: the text table's CPU row counts mmap'd weights as the bytes read (as the
window does) and the note under it says so (issue 13, item 7); only those two lines changed in the
14 text and --explain files, and the JSON files not at all.  ``ds_ik`` (issue 15): ik_llama.cpp from
PR 1510 (2026-03-26) turns mmap off when a weight is overridden to the host (``--cpu-moe`` here), so
the experts and the token embedding are one 376229.11 MiB CUDA_Host buffer instead of the mmap span
(the mmap note goes, the command pins ``--no-mmap``); the three ds_ik files changed only there.
Session 6 (issue 11, the speed estimate only; every memory line unchanged): without ``-t`` the CPU's
threads are llama.cpp's default, the physical cores (pinned here to 8, as the RAM probe is pinned),
and the note says so; a GPU matrix's efficiency follows the rows (tokens) it multiplies, so a routed
expert's share of a micro-batch lowers fully offloaded MoE pp (DeepSeek-V3 162 -> 85.5 t/s, Qwen3-30B
2273 -> 1283); a generated token's attention at depth costs the larger of its KV reads and its FLOPs
(MLA tg at 32768 tokens lower); the pp bottleneck shares move with them.
Session 7 (issue 11, the speed estimate only; every memory line unchanged): op offload copies host
weights that sit in the mmap'd ``CPU_Mapped`` buffer (pageable; llama-model-loader.cpp keeps CPU
weights out of the pinned host buffer when mmap is on) at half the pinned rate (llama.cpp PR 28223:
166 vs 330 t/s on one rig), so the mainline cases with experts on the CPU have half the pp copy rate
(DeepSeek-V3 --cpu-moe 23.6 -> 13.7 t/s, the copies' share 72% -> 84%) and name the assumption;
``ds_ik`` (pinned: ik turns mmap off) and the all-on-GPU cases did not change.  Then ik_llama.cpp's
CPU compute efficiency 2.0 -> 1.77 x peak (re-derived from the same five public CPU-only records with
their CPUs' base clocks declared): ``ds_ik`` pp 33.9 -> 30.5 t/s, its note names the new figure.
Then a GPU's fixed time per layer a token (``gpu_layer_us``, 40 µs): every case with layers on a GPU
has a slower tg (its GPU rows' ms/token and shares, the tg figures, an assumption line); pp and every
memory line unchanged.
Then a CPU micro-batch's reads add to its compute instead of overlapping it, and ik_llama.cpp's CPU
efficiency is 2.0 again (the same five records' median under that model): ``ds_ik`` (its experts
computed on the CPU at -ub 512) pp 30.5 -> 19.6 t/s; no other case computes weights on the CPU.
Then the speed line writes rates below 100 t/s with three significant figures, as the window does
(``ui.rates.rate_text``), instead of one decimal: ``tg 2.7 t/s at depth 0, 2.5 t/s at 32768 tokens``
-> ``tg 2.68 t/s ..., 2.47 t/s ...``; only that line changed, in the 12 DeepSeek text and --explain
files (rates of 10 t/s and more read the same; the JSON files carry unrounded figures).
Then those three significant figures keep their trailing zeros (``core.speed.tps.tps_text``): a rate
of 2.4995 t/s was written ``2.5`` beside ``2.72`` (and 7.999 as ``8``), as if it were rounder than
its neighbours; ``ds_layer3_on_gpu`` text and --explain: ``2.5 t/s at 32768 tokens`` -> ``2.50``,
the only line changed.
Then (issue 11, the speed estimate only; every memory line unchanged) a CPU core's compute follows its
instruction set (core.speed.cpu_isa: read from ``/proc/cpuinfo``, pinned here to none, so the CPU keeps
the AVX2 figure and every CPU compute line reads as before), and ik_llama.cpp's CPU efficiency, fitted
at 2.0 x the AVX2 figure on five public records whose CPUs all have AVX-512 VNNI, is now 2.0 / 1.95 of
the instruction set's figure: unchanged on such CPUs, 1.03 x on an AVX2 one (or one not known, as here):
``ds_ik`` pp 19.6 -> 13.3 t/s, its CPU share 92% -> 95%, its efficiency line names the new figure;
only the three ``ds_ik`` files changed.
Then (issue 11, the speed estimate only; every memory line and every tg figure unchanged) a prompt's
micro-batches leave out the output matrix and the last layer's FFN, which llama.cpp's model graphs run
for the output rows alone (``inp_out_ids``: one token a prompt; core.speed.pp.output_rows_only): pp
figures 1-4% higher (DeepSeek-V3 all on GPU 85.5 -> 87.3 t/s, --cpu-moe 13.7 -> 14.0 t/s), with
their pp_ms / pp_transfer_ms and one pp bottleneck share (77% -> 78%); 33 files.
Session 10: a GPU over capacity while the build's --fit gave up on the command (``n_gpu_layers already
set by user to 999, abort``, common/fit.cpp 464) gets a note saying so under "over capacity": the
``ds_all_on_gpu`` text, --explain and --json files gain that one line (the JSON's notes one entry).
Session 11 (issue 11, the speed estimate only; every memory line and every tg figure unchanged): a CUDA
GPU's matrix efficiency in mainline gains nothing past 512 tokens a matrix (its MMQ tiles are at most
128 wide: core.speed.efficiency.gpu_rows_max_gain), so ``ds_usage_example`` (-ub 2048) pp 43.6 -> 42.4
t/s, its GPUs' pp_ms and the pp bottleneck's share (65% -> 63%) in its three files; no other case runs
more than 512 tokens a matrix on a GPU.
Session 12 (the speed estimate only; every memory line and every existing speed figure unchanged):
with more than one server slot (these commands take the pinned server's -np auto, 4) the speed block
gains one line, ``all 4 slots generating: ...`` (core.speed.slots: one batch of a token per busy
slot a step), and the JSON's ``speed`` one ``slots`` object; all 33 files gained exactly that
(regenerated with ``python tests/test_cli_plan_golden.py --write``, the diff only added lines).
Session 13 (newcomer9): the speed block of a plan with a device over capacity (exit status 3) says its
figures are for the plan as if it fit, as the window's speed line does: ``speed estimate (uncalibrated)
if it fit (CUDA0 over capacity): tg 16.2 ...``; only that line of ``ds_all_on_gpu`` text and
--explain changed (the JSON's ``speed`` object did not; ``ds_fit_four_gpus``, whose GPUs the build's
--fit makes fit, exits 0 and is unchanged).
Session 14 (newcomer10): under ``--explain`` the speed block's ``graph splits:`` line says what a graph
split is (core.speed.report.SPLIT_MEANING); only that line of the 11 --explain files changed (the text
and JSON files not at all).
Then (newcomer10) a CPU declared larger than this machine's RAM without its RAM speed (ram=/bw=) is
priced at this machine's RAM probe, and a note now says so and how to give the other machine's
(backend.speed_store.probe_speed_note). Every case here declares ``CPU=512GiB`` alone for the demo, so
all 33 files gained that one note (the JSON's ``notes`` one entry); nothing else changed. This
machine's RAM is pinned to 64 GiB (``pinned_system_ram``), as the note names it.
Session 15 (newcomer11): a plan that fits says under its bottlenecks what would make it faster
(core.speed.advice: always-active weights on the CPU; a GPU's room beyond its margin for routed
experts while the RAM binds a token; a larger -ub while op offload binds a prompt longer than one
micro-batch) and that ``fit`` searches it: the 14 text and --explain files of the seven fitting cases
with experts on the CPU gained a ``to make it faster:`` block of 2-4 lines before ``assumptions:``;
nothing else changed (the JSON files and the over-capacity and all-on-GPU cases not at all). Then
the block's last line says that fit keeps the -ot rules that hold routed experts on the CPU, and how
many (``ds_two_gpus_filled`` and ``ds_usage_example``: that one line of their text and --explain files).
Then the speed block of a command whose GPUs the build's --fit makes fit by changing it says its figures
are of the command as written (``speed estimate (uncalibrated) of the command as written (CUDA0 over
capacity: llama-server's --fit runs the command in the note instead: plan that one for its speed): ...``):
that one line of the ``ds_fit_four_gpus`` and ``qwen_fit_one_gpu`` text and --explain files.
Then the faster block says that op offload's copies read the mmap'd file at half the pinned rate (the
estimate's own assumption) and that ``-lm none`` pins them (one line more in the 12 files of the six
mainline cases whose prompt op offload binds; ``ds_ik`` is pinned already), and its ``fit`` line says what
fit searches (``searches where the routed experts go and the -ub for you``; it keeps -ngl and mmap).
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

import pytest

from offload_planner.backend import speed_store
from offload_planner.cli import main
from offload_planner.core.speed.hardware import Figure, Source

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "cli_plan"
DS = "resources/DeepSeek-V3-Q4_K_M.header.gguf"
QWEN = "resources/Qwen3-30B-A3B-Q4_K_M.header.gguf"
ONE_GPU = ("--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=512GiB")
TWO_GPUS = (*ONE_GPU, "--device", "CUDA1=24GiB")
EXPS = r"blk\.([5-9]|[1-4][0-9]|5[0-8])\.ffn_(up|gate|down|gate_up)_exps=CPU"

#: name -> (model, planner options, llama-server arguments): the README's commands in order, then
#: variants
CASES: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "ds_all_on_gpu": (DS, ONE_GPU, ("-ngl", "999", "-c", "32768")),
    "ds_cpu_moe": (DS, ONE_GPU, ("-ngl", "999", "-c", "32768", "--cpu-moe")),
    "ds_layer3_on_gpu": (DS, ONE_GPU, ("-ngl", "999", "-c", "32768", "-ot",
                                       r"blk\.3\.ffn_(up|gate|down|gate_up)_exps=CUDA0", "--cpu-moe")),
    "ds_two_gpus": (DS, TWO_GPUS, ("-ngl", "999", "-c", "32768", "-ts", "1,1", "--cpu-moe")),
    "ds_two_gpus_filled": (DS, TWO_GPUS, ("-c", "32768", "-ngl", "999", "-ts", "31,31", "-ot", EXPS)),
    "ds_usage_example": (DS, TWO_GPUS, ("-ngl", "999", "-ts", "1,1", "-ot", "exps=CPU", "-c", "32768",
                                        "-ub", "2048")),
    "ds_ik": (DS, (*ONE_GPU, "--backend", "ik_llama.cpp"), ("-ngl", "999", "-c", "32768", "--cpu-moe")),
    "qwen_all_on_gpu": (QWEN, ONE_GPU, ("-ngl", "999", "-c", "32768")),
    "qwen_cpu_moe": (QWEN, TWO_GPUS, ("-ngl", "999", "-c", "32768", "-ts", "1,1", "--cpu-moe")),
    # --fit at work (the pinned build's default): what it changes is part of the output
    "ds_fit_four_gpus": (DS, (*TWO_GPUS, "--device", "CUDA2=24GiB", "--device", "CUDA3=24GiB"),
                         ("-c", "32768")),
    "qwen_fit_one_gpu": (QWEN, ("--no-detect", "--device", "CUDA0=16GiB", "--device", "CPU=512GiB"),
                         ("-c", "65536")),
}
MODES: dict[str, tuple[str, ...]] = {"text": (), "explain": ("--explain",), "json": ("--json",)}


def pinned_ram(*, measure: bool = True) -> Figure:
    """The plan's speed estimate reads this machine's RAM bandwidth (a probe, noisy and different on
    every machine): one figure for the expected files and every run of the test."""
    return Figure(40.0, "GB/s", Source.MEASURED, "RAM probe pinned by tests/test_cli_plan_golden.py")


def no_thread_figure(*, measure: bool = True) -> None:
    """Nor the single-thread copy (a probe as well): not known, the default per-thread figure, as the
    expected files were written with."""
    return None


def pinned_cores() -> int:
    """llama.cpp's default ``-t`` is this machine's physical cores: one count for the expected files
    on every machine."""
    return 8


def pinned_system_ram() -> int:
    """This machine's RAM (a declared CPU larger than it is noted): one size for the expected files on
    every machine."""
    return 64 << 30


def pinned_cpu(devices: object) -> None:
    """The CPU's instruction set is this machine's (``/proc/cpuinfo``): none for the expected files on
    every machine (the AVX2 figure, as before the instruction set was read)."""
    return None


def run_plan(case: str, mode: str) -> tuple[int, str]:
    model, ours, server = CASES[case]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", model, *ours, *MODES[mode], "--", *server])
    return code, f"exit {code}\n{out.getvalue()}"


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("case", list(CASES))
def test_plan_output_is_byte_identical(case: str, mode: str, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    monkeypatch.chdir(ROOT)  # the model paths are printed as given: relative to the checkout
    monkeypatch.setenv("OFFLOAD_PLANNER_CONFIG_DIR", str(tmp_path))  # no user settings
    monkeypatch.setattr(speed_store, "host_bandwidth", pinned_ram)
    monkeypatch.setattr(speed_store, "thread_bandwidth", no_thread_figure)
    monkeypatch.setattr(speed_store, "physical_cores", pinned_cores)
    monkeypatch.setattr(speed_store, "machine_cpu", pinned_cpu)
    monkeypatch.setattr(speed_store, "system_ram", pinned_system_ram)
    _, got = run_plan(case, mode)
    want = (DATA / f"{case}.{mode}.txt").read_text(encoding="utf-8")
    assert got == want


if __name__ == "__main__":  # writes the expected files (only from the code before the change)
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/test_cli_plan_golden.py --write")
    import os
    import tempfile

    os.chdir(ROOT)
    speed_store.host_bandwidth = pinned_ram
    speed_store.thread_bandwidth = no_thread_figure
    speed_store.physical_cores = pinned_cores  # type: ignore[assignment]
    speed_store.machine_cpu = pinned_cpu  # type: ignore[assignment]
    speed_store.system_ram = pinned_system_ram
    DATA.mkdir(parents=True, exist_ok=True)
    for c in CASES:
        for m in MODES:
            with tempfile.TemporaryDirectory() as cfg:  # as the test: an empty config each time
                os.environ["OFFLOAD_PLANNER_CONFIG_DIR"] = cfg
                (DATA / f"{c}.{m}.txt").write_text(run_plan(c, m)[1], encoding="utf-8")
