"""Where a move's time goes: ``bench/replan_speed.py``'s worst cold move per catalogue model, in parts.

Same setting and moves as ``replan_speed.py`` (it imports them).  Per model, the layer whose cold move
is slowest is re-projected ``--runs`` times with the replay's steps timed (``time.process_time``
around the step functions; the wrappers add a little to every part) and printed per move in
microseconds:

* ``outside``: the projection besides the compute simulation (placement, weight, KV and output
  buffers, explanations, memo keys): the same move re-projected with the compute memo warm, untimed
  steps (the 10th percentile of ``--runs``);
* ``one-token``: the one-token graph's replay (left out by a bound after passes 1-4 where it decides
  no size);
* the prompt graph's replay: passes 1-4, pass 5 with the sched window, the allocator's start
  (checkpoint, counts) and walk, and the rest (reference look-up, item diff, copies, the result);
* ``p5 nodes`` / ``alloc window``: the real nodes pass 5 re-split and the nodes of the allocator's
  window (from its checkpoint; stretches of the reference's own nodes in it may be jumped), and
  ``us/window node``: the walk's time per window node, against ``us/node``: a from-scratch
  simulation's time per scheduled node (both graphs; build, schedule and allocate).

``--layers``: a row per layer's move instead (named ``MODEL LAYER``; a layer without tensors to move
has none, as in ``replan_speed.py``), to see which layers' moves cost what.

    python bench/replan_parts.py [--only NAME ...] [--runs 200] [--layers]
"""

from __future__ import annotations

import argparse
import importlib
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import replan_speed as rs
from offload_planner.core import compute
from offload_planner.core import plan as plan_mod
from offload_planner.core.compute import incremental as ci
from offload_planner.core.compute import replay, replay_alloc
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.plan import Plan
from offload_planner.core.synth import all_models, write_model

sim_mod = importlib.import_module("offload_planner.core.compute.simulate")
ACC: defaultdict[str, float] = defaultdict(float)
NODES: defaultdict[str, int] = defaultdict(int)
GRAPH = ["prompt"]  # the graph being replayed: the steps' times and nodes count for it


def timed(obj: Any, name: str, label: Callable[..., str] | str) -> None:
    """``obj.name`` timed into ``ACC`` under ``label`` (or ``label(*args, **kwargs)``)."""
    f = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        key = label if isinstance(label, str) else label(*args, **kwargs)
        t0 = time.process_time()
        try:
            return f(*args, **kwargs)
        finally:
            ACC[key] += time.process_time() - t0

    setattr(obj, name, wrapper)


def graph_of(*args: Any, below: list[int] | None = None, **kwargs: Any) -> str:
    """The graph an ``incremental_reserve`` call replays (the planner passes ``below`` for the
    one-token graph only), remembered for the steps inside it."""
    GRAPH[0] = "one-token" if below is not None else "prompt"
    return GRAPH[0]


def instrument() -> None:
    timed(plan_mod.Plan, "projection", "total")
    timed(sim_mod, "incremental_reserve", graph_of)
    for cls, name, label in ((replay._Replay, "assign", "passes 1-4"), (replay._Replay, "pass5", "pass 5"),
                             (replay._Replay, "window", "pass 5"),
                             (replay_alloc._AllocReplay, "__init__", "alloc start"),
                             (replay_alloc._AllocReplay, "run", "alloc walk")):
        timed(cls, name, lambda *a, label=label, **k: f"{GRAPH[0]} {label}")
    pass5, walk = replay._Replay.pass5, replay_alloc._AllocReplay.run

    def counted_pass5(self: replay._Replay, fa: int, fb: int) -> None:
        pass5(self, fa, fb)
        NODES[f"{GRAPH[0]} p5"] += sum(1 for i in range(fa, self.x) if self.ref.cur_before[i] != -2)

    def counted_walk(self: replay_alloc._AllocReplay) -> tuple[list[int], list[str]]:
        NODES[f"{GRAPH[0]} walked"] += len(self.wnodes)
        return walk(self)

    replay._Replay.pass5 = counted_pass5  # type: ignore[method-assign]
    replay_alloc._AllocReplay.run = counted_walk  # type: ignore[method-assign]


def p10_ms(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return sorted(times)[len(times) // 10] * 1000


def cold(p: Plan) -> None:
    compute.MEMO.clear()
    rs.tail_memos(clear=True)
    p.projection()


def model_parts(name: str, path: Path, runs: int, every: bool) -> list[str]:
    """The row of the model's worst cold move, or (``every``) one row per layer's move."""
    model = open_model(path)
    compute.record_at_first_sight()
    plan, moe = rs.base_plan(model)
    placement = plan.placement()
    ctx = resolve_context(plan.context, model.summary.n_ctx_train, model.summary.n_swa)
    scratch = p10_ms(lambda: compute.simulate(model, rs.DEVICES, placement, ctx, plan.context), 20)
    plan.projection()  # records the references
    n_sched = sum(len(r.sched_nodes) for key, refs in ci._REFS.items() if key[0] is model for r in refs)
    layer_of = {t.name: t.layer for t in model.tensors}
    layers = [(layer_of[next(iter(mv))], plan.with_moves(mv)) for mv in rs.layer_moves(model, plan, moe)]
    moves = [p for _, p in layers]
    if every:
        return [move_parts(f"{name} {il}", p, runs, scratch, n_sched) for il, p in layers]
    worst = max(moves, key=lambda p: p10_ms(lambda: cold(p), 20))
    return [move_parts(name, worst, runs, scratch, n_sched)]


def move_parts(name: str, worst: Plan, runs: int, scratch: float, n_sched: int) -> str:
    """One move's row: its parts, cold, in microseconds."""
    worst.projection()
    outside = p10_ms(worst.projection, runs) * 1000  # (the compute buffers from the memo)
    ACC.clear()
    NODES.clear()
    for _ in range(runs):
        cold(worst)
    us: defaultdict[str, float] = defaultdict(float, {k: v / runs * 1e6 for k, v in ACC.items()})
    parts = [us[f"prompt {k}"] for k in ("passes 1-4", "pass 5", "alloc start", "alloc walk")]
    walked = NODES["prompt walked"] / runs
    cells = (name, f"{scratch:.2f}", f"{scratch * 1000 / n_sched:.1f}", f"{us['total']:.0f}",
             f"{outside:.0f}", f"{us['one-token']:.0f}", *(f"{x:.0f}" for x in parts),
             f"{us['prompt'] - sum(parts):.0f}", f"{NODES['prompt p5'] / runs:.0f}", f"{walked:.0f}",
             f"{us['prompt alloc walk'] / max(walked, 1):.1f}")
    return rs._row(cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--layers", action="store_true",
                    help="a row per layer's move (the moves in layer order), not only the worst cold one")
    args = ap.parse_args()
    instrument()
    specs = all_models()
    print(rs._row(("model", "scratch ms", "us/node", "move us", "outside", "one-token", "passes 1-4",
                   "pass 5+window", "alloc start", "alloc walk", "prompt rest", "p5 nodes", "alloc window",
                   "us/window node")), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or list(specs):
            path = write_model(specs[name], Path(tmp) / f"{name}.header.gguf", header_only=True)[0]
            for row in model_parts(name, path, args.runs, args.layers):
                print(row, flush=True)


if __name__ == "__main__":
    main()
