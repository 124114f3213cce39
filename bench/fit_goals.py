"""The fastest plan's answer on every cell of ``bench/fit_vs_baselines.py`` for the three goals, in one
process, and the comparison of two such runs (two checkouts of the search).

Per model (the synth's big MoE headers and Kimi K2), device set and goal (tg, pp, balanced): the
answer's label, its estimated tg and pp (t/s), its score for the goal, the full projections the search
made and its CPU seconds (llama.cpp's ``--fit`` baseline in the process: no fork).  ``--json FILE``
writes the rows; ``--compare OLD.json NEW.json`` prints the cells whose score changed (the ratio of the
new to the old), how many are slower, and the total CPU seconds of each run.

    PYTHONPATH=<checkout>/gui python bench/fit_goals.py [--models ...] [--sets ...] --json out.json
    python bench/fit_goals.py --compare old.json new.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_vs_baselines import BASE, MODELS, SETS, devices

GOALS = ("tg", "pp", "balanced")


def run(models: list[str], sets: list[str]) -> dict[str, dict[str, Any]]:
    from offload_planner.core.gguf_reader import open_model
    from offload_planner.core.speed.fastest import fastest_plan
    from offload_planner.core.speed.hardware import hardware_for
    from offload_planner.core.speed.ranking import score
    from offload_planner.core.synth import write_model

    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            [path] = write_model(MODELS[name], Path(tmp) / f"{name}.gguf", header_only=True)
            model = open_model(str(path))
            for set_name in sets:
                ds = devices(SETS[set_name])
                hw = hardware_for(ds, threads=32)
                for goal in GOALS:
                    c0 = time.process_time()
                    r = fastest_plan(model, ds, BASE, hw, goal=goal)
                    cpu = time.process_time() - c0
                    b = r.best
                    row = {"label": b.label if b else None, "tg": b.estimate.tg_tps if b else 0.0,
                           "pp": b.estimate.pp_tps if b else 0.0,
                           "score": score(b.estimate, goal) if b else 0.0,
                           "projections": r.projections, "cpu": cpu}
                    out[f"{name} {set_name} {goal}"] = row
                    print(f"{name:24} {set_name:6} {goal:8} {row['tg']:8.2f} {row['pp']:9.1f} "
                          f"{r.projections} proj {cpu:5.2f} s  {row['label']}", flush=True)
    return out


def compare(old: dict[str, dict[str, Any]], new: dict[str, dict[str, Any]]) -> None:
    both = [k for k in old if k in new]
    slower = 0
    for k in both:
        a, b = old[k], new[k]
        if a["score"] and b["score"] != a["score"]:
            x = b["score"] / a["score"]
            slower += x < 1
            print(f"{k:40} {x - 1:+.2%}  tg {a['tg']:.2f} -> {b['tg']:.2f}  pp {a['pp']:.1f} -> "
                  f"{b['pp']:.1f}  proj {a['projections']} -> {b['projections']}  "
                  f"{a['label']} -> {b['label']}")
    print(f"{len(both)} cells, {slower} slower; CPU {sum(old[k]['cpu'] for k in both):.1f} s -> "
          f"{sum(new[k]['cpu'] for k in both):.1f} s (separate runs: compare on a quiet machine)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--json")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    a = ap.parse_args()
    if a.compare:
        compare(*(json.loads(Path(p).read_text()) for p in a.compare))
        return
    rows = run(a.models.split(","), a.sets.split(","))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
