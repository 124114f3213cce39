"""Where a one-shot ``plan``'s time goes beyond opening the file and its own simulation, per catalogue
model: ``bench/plan_speed.py``'s ``-fit off`` plan and reference (it imports them), the plan's steps
timed with ``time.process_time`` around the functions ``cli_plan`` calls (the wrappers add about a
microsecond to each), best of ``--runs`` per column, milliseconds:

* ``ref open`` / ``own open``: the reference opening the file (the cycle collector on) and the plan
  (``open_model`` and the loadable check; ``plan`` keeps the collector off throughout);
* ``ref sim`` / ``own sim``: the reference's plain simulation (both reserves walked) and the plan's
  own (the one-shot path: the one-token reserve's walk left out where a bound proves it decides no
  size, ``core/compute/bound.py``); ``own tg``: of the latter, the one-token reserve (its graph built
  and scheduled, the bound, and the walk where the bound does not prove it: ``reserve_below``), what
  a proof without the graph would save;
* ``budget``: the reference less the plan's opening and own simulation: what the plan may spend
  besides them and stay within the reference (the target: ``beyond <= budget``);
* ``beyond``: the plan less its opening and its own simulation, in parts: ``args`` (the command's
  options, llama-server's arguments and their checks), ``devices`` (declared, detected and the RAM
  total), ``analysis`` (the plan, its placement, the weight/KV/output buffers, warnings, notes and the
  reproducing command: ``analyse_command`` less the simulation), ``machine`` (this machine's figures
  for the speed estimate: the cached RAM probe, the CPU, its cores, efficiencies), ``estimate`` (the
  speed estimate less them), ``text`` (the table, the speed lines, the command's text) and ``other``
  (the rest: notes, capacity, the output's assembly).

    python bench/plan_parts.py [--only NAME ...] [--runs 20]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import plan_speed as ps
from offload_planner.core.synth import SMALL_MODELS, all_models, write_model

#: (module, function) timed inside the plan, as ``cli_plan`` looks them up when it runs
TIMED = (("offload_planner.cli", "_quick_parse"), ("offload_planner.cli_server_args", "read_server_argv"),
         ("offload_planner.core.cmdline", "check_semantics"), ("offload_planner.cli_plan", "_open_model"),
         ("offload_planner.cli_plan", "_devices"), ("offload_planner.core.analysis", "analyse_command"),
         ("offload_planner.core.compute.buffers", "simulate"),
         ("offload_planner.core.compute.simulate", "reserve_below"),
         ("offload_planner.backend.speed_store", "plan_speed"),
         ("offload_planner.backend.speed_store", "machine_hardware"),
         ("offload_planner.backend.speed_store", "efficiencies_for"),
         ("offload_planner.core.plan_report", "plan_text"),
         ("offload_planner.core.speed.report", "speed_lines"),
         ("offload_planner.core.cmdline", "format_command"))

COLUMNS = ("ref open", "own open", "ref sim", "own sim", "own tg", "budget", "beyond", "args", "devices",
           "analysis", "machine", "estimate", "text", "other")
#: the parts of ``beyond`` but ``other``
PARTS = ("args", "devices", "analysis", "machine", "estimate", "text")


@contextmanager
def timed(acc: dict[str, float]) -> Iterator[None]:
    """Each of :data:`TIMED` adds its CPU seconds to ``acc[name]`` while inside."""
    kept: list[tuple[Any, str, Callable[..., Any]]] = []
    for mod_name, name in TIMED:
        mod = importlib.import_module(mod_name)
        real = getattr(mod, name)

        def wrapper(*a: Any, _real: Callable[..., Any] = real, _name: str = name, **k: Any) -> Any:
            t0 = time.process_time()
            try:
                return _real(*a, **k)
            finally:
                acc[_name] += time.process_time() - t0

        setattr(mod, name, functools.wraps(real)(wrapper))
        kept.append((mod, name, real))
    try:
        yield
    finally:
        for mod, name, real in kept:
            setattr(mod, name, real)


def parts(path: Path) -> dict[str, float]:
    """One run: the reference's simulation and the plan's parts, ms."""
    ref_open, ref_sim = ps.reference_parts(path)
    acc: dict[str, float] = defaultdict(float)
    with timed(acc):
        total = ps.plan_ms(path, ["-fit", "off"])
    ms = {k: v * 1000 for k, v in acc.items()}
    sim, opened = ms["simulate"], ms["_open_model"]
    got = {"ref open": ref_open, "own open": opened, "ref sim": ref_sim, "own sim": sim,
           "own tg": ms.get("reserve_below", 0.0),
           "beyond": total - opened - sim,
           "args": ms["_quick_parse"] + ms["read_server_argv"] + ms["check_semantics"],
           "devices": ms["_devices"], "analysis": ms["analyse_command"] - sim,
           "machine": ms["machine_hardware"] + ms["efficiencies_for"],
           "text": ms["plan_text"] + ms["speed_lines"] + ms["format_command"]}
    got["estimate"] = ms["plan_speed"] - got["machine"]
    got["budget"] = ref_open + ref_sim - opened - sim
    got["other"] = got["beyond"] - sum(got[k] for k in PARTS)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", metavar="NAME")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    specs = all_models()
    names = args.only or list(SMALL_MODELS)
    print(f"{'model':<14}" + "".join(f"{c:>9}" for c in COLUMNS) + "   (ms, best of each)")
    with tempfile.TemporaryDirectory() as tmp:
        warm = write_model(SMALL_MODELS["qwen3moe"], Path(tmp) / "warm.gguf")[0]
        ps.plan_ms(warm, ["-fit", "off"])  # imports and first-use costs, not the model's
        for name in names:
            path = write_model(specs[name], Path(tmp) / f"{name}.header.gguf", header_only=True)[0]
            runs = [parts(path) for _ in range(args.runs)]
            best = {c: min(r[c] for r in runs) for c in COLUMNS if c not in ("budget", "other")}
            best["budget"] = best["ref open"] + best["ref sim"] - best["own open"] - best["own sim"]
            best["other"] = best["beyond"] - sum(best[k] for k in PARTS)
            print(f"{name:<14}" + "".join(f"{best[c]:9.2f}" for c in COLUMNS), flush=True)


if __name__ == "__main__":
    main()
