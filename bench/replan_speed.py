"""Re-plan speed on every model the catalogue writes: one move re-projected against a from-scratch
simulation, worst layer.

Each model (``core/synth/catalog.py``, written header-only into a temporary folder) is planned on
two 24 GiB CUDA GPUs with ``-ngl 999 -ts 1,1 -c 32768 -ub 2048``; MoE models with their routed
experts on the CPU (``-ot exps=CPU``), dense ones with ``-ot token_embd=CPU`` (where it is anyway:
any override turns pipeline parallelism off, as the first move would).  A *move* is one layer's
routed experts to the other GPU (MoE) or one whole layer to the CPU (dense models), made for every
layer in turn and re-projected (``Plan.projection``) with the whole-result memo cleared, so the
compute buffers are really simulated, by replay against the base plan's reference
(``compute.incremental``; recorded at once, as in the window).  Per layer the best of ``--reps``
runs counts, and the 8 slowest layers' moves (warm and cold) are timed again with three times as
many runs (the best of all kept: the worst of 80 layers is otherwise decided by one load spike that
met all of one layer's few runs; a layer that is really slow stays slow however often it runs); per model the
table prints the from-scratch simulation (``compute.simulate`` without replay, both reserved
graphs, best of ``--full-runs``), the median and the worst layer's re-projection, and worst /
from-scratch against the 1/20 target.  Times are the process's CPU time
(``time.process_time``), which other processes disturb less than the wall clock.

A move re-schedules and re-allocates its layer from the first node that reads a moved tensor to the
layer's end: the ``a move's nodes`` column gives, for the move with the most, that share of the nodes a
from-scratch simulation schedules (prompt and one-token graphs; on a 4-layer model about an eighth).
It bounds a move only as far as a replayed node costs what a simulated one does (the replay's walk
costs less per node: ``replan_parts.py``).  The ``null move`` column is measured: a re-projection that
replays nothing (no move), which every move pays besides its replay; where it alone is above 1/20 the
verdict is ``out of reach``.  For every model that misses the target a line under the table gives the
numbers.
``bench/replan_parts.py`` breaks each model's worst move into its parts (the projection outside the
simulation, the one-token graph, passes 1-4 and 5, the allocator's start and walk).

A move's replay keeps, on the reference, the allocator states its tail passed (a move leaves the
residual stream in the other of two blocks up to the next device boundary, and the next move's tail
meets the same states: ``replay_alloc._tail``).  So each layer is timed twice: *warm*, with the
states the earlier moves' tails left (as a window's edits go on; each rep starts from them, not from
what the move's own first rep added), and *cold*, with every reference's memo emptied first.  The
verdict: ``met`` when the cold worst layer meets the target, ``warm only`` when only the warm one
does.  Both jump whole periods of equal layers where the allocator's state repeats
(``compute.periods``, recorded with the reference), so a cold tail walks a few layers, not all of
them up to the device boundary.

The *plan* columns (``--no-plan`` leaves them out) are ``bench/plan_speed.py``'s measure: the whole
one-shot ``plan -fit off`` command in this process, from empty planner caches, against opening the
file plus one plain simulation (target <= 1; see that script for what counts).

    python bench/replan_speed.py [--only NAME ...] [--reps 2] [--full-runs 3]
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import fit_speed
import plan_speed
from offload_planner.core import compute
from offload_planner.core.compute import incremental as ci
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import resolve_context
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.synth import all_models, write_model

GIB = 1024**3
TARGET = 1 / 20
LAYERS = False  # --layers: print every layer's times
OUT_OF_REACH: list[str] = []  # the models a move cannot meet the target on, with the numbers
RETIME, RETIME_FACTOR = 8, 3  # the slowest layers timed again, with this many times --reps runs
DEVICES = DeviceSet(
    Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB),
    tuple(Device(f"CUDA{i}", DeviceKind.CUDA, 24 * GIB, 23 * GIB) for i in range(2)),
)


def best_ms(fn: Callable[[], object], runs: int, before: Callable[[], object] = lambda: None) -> float:
    times = []
    for _ in range(runs):
        before()
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times) * 1000


Memo = dict[tuple[object, ...], tuple[int, str]]


def tail_memos(clear: bool = False) -> list[tuple[Memo, Memo]]:
    """Each recorded reference's memo of replayed tails with a copy of it (emptied first: ``clear``)."""
    out = []
    for refs in ci._REFS.values():
        for ref in refs:
            if clear:
                ref.tail_memo.clear()
            out.append((ref.tail_memo, dict(ref.tail_memo)))
    return out


def restore(memos: list[tuple[Memo, Memo]]) -> None:
    for memo, copy in memos:
        memo.clear()
        memo.update(copy)


def base_plan(model: Model) -> tuple[Plan, bool]:
    moe = any(t.role.is_routed_expert for t in model.tensors)
    # dense: the token embedding is on the CPU anyway; a matching -ot turns pipeline parallelism off,
    # as any move does (else the first move changes the graph's topology)
    ot = [SimpleNamespace(pattern="exps" if moe else "token_embd", buft="CPU", source="-ot")]
    args = SimpleNamespace(ctx_size=32768, n_gpu_layers=999, tensor_split=[1, 1], ubatch_size=2048,
                           overrides=ot)
    return plan_from_args(model, DEVICES, args), moe


def layer_moves(model: Model, plan: Plan, moe: bool) -> list[dict[str, str]]:
    """One move per layer: its routed experts to the GPU they are not on (MoE), or all of its
    tensors to the CPU (dense)."""
    pl = plan.placement()
    layer_dev = {il: pl.layer_device(il) for il in range(model.summary.n_layer)}
    out = []
    for il in range(model.summary.n_layer):
        ts = [t.name for t in model.tensors if t.layer == il and (t.role.is_routed_expert or not moe)]
        if not ts:
            continue
        to = ("CUDA1" if layer_dev[il] == "CUDA0" else "CUDA0") if moe else "CPU"
        out.append({n: to for n in ts})
    return out


def move_nodes(model: Model, names: set[str]) -> tuple[int, int]:
    """Nodes of the recorded prompt graph from the first one reading a tensor of ``names`` to the end
    of that layer, and the nodes of both reserved graphs (prompt and one token), as scheduled."""
    refs = sorted((r for key, rs in ci._REFS.items() if key[0] is model and not key[5] for r in rs),
                  key=lambda r: r.sh.n_tokens)
    pp, tg = refs[-1], refs[0]
    first = min((pp.sp[i] for i, src in enumerate(pp.orig_src)
                 if any(s is not None and s.weights and s.name in names for s in src)),
                default=len(pp.sched_nodes))
    bounds = pp.periods.bounds
    k = bisect.bisect_right(bounds, first)
    end = bounds[k] if k < len(bounds) else len(pp.sched_nodes)
    return end - first, len(pp.sched_nodes) + len(tg.sched_nodes)


def bench_model(name: str, path: Path, reps: int, full_runs: int) -> tuple[str, ...]:
    model = open_model(path)
    compute.record_at_first_sight()  # as the window does: the base plan's projection records the reference
    plan, moe = base_plan(model)
    placement = plan.placement()
    ctx = resolve_context(plan.context, model.summary.n_ctx_train, model.summary.n_swa)
    if compute.graph_builder(model) is None:
        return (name, "no graph", "", "", "", "", "", "", "", "")
    scratch = best_ms(lambda: compute.simulate(model, DEVICES, placement, ctx, plan.context), full_runs)
    plan.projection()  # records the replay reference of the base plan
    null = null_move_ms(plan, reps)
    warm, cold, runs = [], [], []
    most = (0, 1)  # the move with the most nodes to re-simulate (nodes, of the simulation's)
    for mv in layer_moves(model, plan, moe):
        most = max(most, move_nodes(model, set(mv)), key=lambda e: e[0] / e[1])
        p = plan.with_moves(mv)

        def run(p: Plan = p) -> None:
            compute.MEMO.clear()  # no whole-result memo: every run simulates
            p.projection()

        memos = tail_memos()  # what the earlier moves' tails left, not what this move's first run adds
        warm.append(best_ms(run, reps, lambda memos=memos: restore(memos)))  # type: ignore[misc]
        cold.append(best_ms(run, reps, lambda: tail_memos(clear=True)))
        runs.append((run, memos))
        restore(memos)
        run()  # the tails this move passes, for the next move (as a window's edits go on)
    retime_slowest(warm, cold, runs, reps)
    worst, worst_cold = max(warm), max(cold)
    if LAYERS:
        print(name, "warm", " ".join(f"{x:.1f}" for x in warm))
        print(name, "cold", " ".join(f"{x:.1f}" for x in cold))
    share = most[0] / most[1]
    verdict = ("met" if worst_cold / scratch <= TARGET else "warm only" if worst / scratch <= TARGET
               else "out of reach" if null / scratch > TARGET else "NOT MET")
    if worst_cold / scratch > TARGET:
        OUT_OF_REACH.append(
            f"{name}: {model.summary.n_layer} layers; a move that changes nothing costs {null * 1000:.0f} us "
            f"(1/{scratch / null:.0f} of {scratch:.2f} ms: "
            f"{'above' if null / scratch > TARGET else 'under'} the target alone); the worst move "
            f"{worst_cold * 1000:.0f} us (1/{scratch / worst_cold:.1f}); its nodes from the first reading "
            f"a moved tensor to the layer's end: {most[0]} of the {most[1]} a from-scratch simulation "
            f"schedules (1/{1 / share:.1f})")
    return (name, f"{scratch:9.1f}", f"{statistics.median(warm):8.2f}", f"{worst:8.2f}",
            f"1/{scratch / worst:5.0f}", f"{worst_cold:8.2f}", f"1/{scratch / worst_cold:5.0f}",
            f"1/{1 / share:5.1f}", f"1/{scratch / null:5.0f}", verdict)


def null_move_ms(plan: Plan, reps: int) -> float:
    """A re-projection that replays nothing (no move: both reserves are the references'), with the
    whole-result memo cleared: what every move costs besides its replay (the placement, weight, KV and
    output buffers, the memo's key, the simulation's set-up, the references' look-up and item diff, the
    buffers' explanations); a model where it alone is above the target is out of reach."""
    p = plan.with_moves({})

    def run() -> None:
        compute.MEMO.clear()
        p.projection()

    return best_ms(run, 10 * reps)


Timed = tuple[Callable[[], None], list[tuple[Memo, Memo]]]  # a layer's move and the memos before it


def retime_slowest(warm: list[float], cold: list[float], runs: list[Timed], reps: int) -> None:
    """The ``RETIME`` slowest layers' moves, warm and cold, timed again with ``RETIME_FACTOR * reps`` more
    runs each, keeping the best of all: the worst layer is a real slow one, not one whose few runs all
    met a load spike of the machine (a slow layer stays slow however often it is timed).  Warm runs
    start from the memos the earlier moves left (kept per layer), as in the first pass."""
    for times, warm_start in ((warm, True), (cold, False)):
        for i in sorted(range(len(times)), key=times.__getitem__)[-RETIME:]:
            run, memos = runs[i]
            before = (lambda memos=memos: restore(memos)) if warm_start else (lambda: tail_memos(clear=True))
            times[i] = min(times[i], best_ms(run, RETIME_FACTOR * reps, before))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--full-runs", type=int, default=3)
    ap.add_argument("--no-plan", action="store_true", help="leave out the one-shot plan columns")
    ap.add_argument("--no-fit", action="store_true", help="leave out the --fit line")
    ap.add_argument("--layers", action="store_true", help="print every layer's times too")
    args = ap.parse_args()
    global LAYERS
    LAYERS = args.layers
    specs = all_models()
    names = args.only or list(specs)
    print("moves: two CUDA GPUs, -ngl 999 -ts 1,1 -c 32768 -ub 2048 (MoE: -ot exps=CPU); one move per layer: "
          "its routed experts to a GPU (MoE) or the whole layer to the CPU (dense)")
    print("plan: one-shot `plan -fit off` (same GPUs, -c 32768, MoE -ot exps=CPU) against opening the file "
          "plus one plain simulation")
    head = ("model", "scratch ms", "median ms", "worst ms", "worst/scratch", "worst cold ms", "cold/scratch",
            "a move's nodes", "null move", f"target 1/{1 / TARGET:.0f}")
    if not args.no_plan:
        head += ("open+sim ms", "plan ms", "plan ratio", "target <= 1")
    print(f"each layer: the best of --reps {args.reps} runs (process CPU time); the {RETIME} slowest warm "
          f"and cold layers timed again with {RETIME_FACTOR * args.reps} more runs, the best of all kept "
          f"(a load spike does not decide the worst layer; a slow layer stays slow); worst = over all layers;"
          f" scratch = the best of --full-runs {args.full_runs}")
    print(_row(head), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_plan:  # imports and first-use costs, not the model's
            plan_speed.plan_ms(write_model(specs["qwen3moe"], Path(tmp) / "warm.gguf")[0], ["-fit", "off"])
        for name in names:
            path = write_model(specs[name], Path(tmp) / f"{name}.header.gguf", header_only=True)[0]
            cells = bench_model(name, path, args.reps, args.full_runs)
            if not args.no_plan:
                cells += one_shot_plan(path, args.full_runs)
            print(_row(cells), flush=True)
    for line in OUT_OF_REACH:
        print(line)
    if not args.no_fit:
        compute.record_at_first_sight(False)  # as the command line runs it
        # interleaved: as the CLI runs it (bench/fit_speed.py's verdict) and with the collector on
        runs = [(fit_speed.one_run(4, cli=True), fit_speed.one_run(4)) for _ in range(args.full_runs)]
        scratch = min(min(a[0], b[0]) for a, b in runs)
        cli, fit = min(a[1] for a, _ in runs), min(b[1] for _, b in runs)
        _, _, n, replayed, _ = runs[-1][0]
        verdict = "met" if cli / scratch <= fit_speed.TARGET else "NOT MET"
        print(f"--fit port, DeepSeek-V3 header on 4 x CUDA 24 GiB, -c 32768: {n} dry runs ({replayed} "
              f"replayed), as the CLI runs it {cli:.1f} ms = {cli / scratch:.1f} from-scratch simulations "
              f"({scratch:.1f} ms; target <= {fit_speed.TARGET:.0f}: {verdict}); with the cyclic collector "
              f"on {fit / scratch:.1f}")


def one_shot_plan(path: Path, runs: int) -> tuple[str, ...]:
    """A one-shot ``plan`` (nothing recorded for a later edit) against open + one plain simulation."""
    compute.record_at_first_sight(False)
    ref = min(plan_speed.reference_ms(path) for _ in range(runs))
    plan = min(plan_speed.plan_ms(path, ["-fit", "off"]) for _ in range(runs))
    return (f"{ref:9.1f}", f"{plan:9.1f}", f"{plan / ref:6.2f}", "met" if plan <= ref else "NOT MET")


def _row(cells: tuple[str, ...]) -> str:
    return "  ".join(f"{c:>13}" if i else f"{c:<24}" for i, c in enumerate(cells))

if __name__ == "__main__":
    main()
