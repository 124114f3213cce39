"""The ``fit`` search with a draft model (``-md``): its cost against the same search without one, and
against itself without the draft reuse, all measured in one process.

Qwen3-30B-A3B (the bundled header) with a 4-layer draft of Llama-3.1-70B's width (about 3 GiB, written
header-only by the synth) on one 12 GiB GPU, ``-c 8192``, goal balanced (three ``-ub`` variants).
Per round, CPU seconds of :func:`fastest_plan`: without the draft; with it and every reuse turned off
(the ``-md`` file opened and the draft projected again for every candidate, as before the reuse);
with it as the fit command runs (caches emptied first, as in a fresh process).  Prints the ratios and
whether both draft runs give the same candidates (labels, fits, tg, pp).

    python bench/fit_draft.py [--rounds N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from offload_planner.core import speculative
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.speed.candidate import FastestResult
from offload_planner.core.speed.efficiency import defaults_for
from offload_planner.core.speed.fastest import fastest_plan
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.synth import write_model
from offload_planner.core.synth.catalog import BIG_MODELS

RES = Path(__file__).resolve().parents[1] / "resources"


def _rows(r: FastestResult) -> list[tuple[Any, ...]]:
    return [(c.label, c.fits, c.estimate.tg_tps, c.estimate.pp_tps) for c in r.candidates]


def _uncached(on: bool) -> None:
    """Turn the draft reuse off (``on``) or back on, by swapping in the functions it wraps."""
    opened, projected = _CACHED
    speculative._open_draft = opened.__wrapped__ if on else opened  # type: ignore[assignment]
    speculative.draft_buffers = projected.__wrapped__ if on else projected  # type: ignore[assignment]


_CACHED = (speculative._open_draft, speculative.draft_buffers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    qwen = open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))
    ds = DeviceSet(parse_device_decl("CPU=256GiB,ram=4xDDR5-5600"),
                   (parse_device_decl("CUDA0=12GiB,bw=936GB/s"),))
    hw = hardware_for(ds, threads=16)
    eff = defaults_for("llama.cpp")
    with tempfile.TemporaryDirectory() as tmp:
        spec = replace(BIG_MODELS["Llama-3.1-70B-Q4_K_M"], name="draft", n_layer=4)
        [draft] = write_model(spec, Path(tmp) / "draft.header.gguf", header_only=True)

        def run(args: list[str]) -> tuple[float, FastestResult]:
            t = time.process_time()
            r = fastest_plan(qwen, ds, args, hw, goal="balanced", eff=eff)
            return time.process_time() - t, r

        plain, withd = ["-c", "8192"], ["-c", "8192", "-md", str(draft)]
        run(plain), run(withd)  # imports and the main model's graph templates
        print(f"{'round':>5} {'plain s':>8} {'draft, no reuse s':>18} {'draft s':>8} {'no reuse/plain':>15} "
              f"{'draft/plain':>12} {'speed-up':>9} same")
        for i in range(a.rounds):
            p, _ = run(plain)
            _uncached(True)
            try:
                u, ru = run(withd)
            finally:
                _uncached(False)
            speculative._open_draft.cache_clear()
            speculative.draft_buffers.cache_clear()
            d, rd = run(withd)
            print(f"{i + 1:>5} {p:8.3f} {u:18.3f} {d:8.3f} {u / p:15.2f} {d / p:12.2f} {u / d:9.2f} "
                  f"{_rows(ru) == _rows(rd)}")


if __name__ == "__main__":
    main()
