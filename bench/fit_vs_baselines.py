"""The fastest plan that fits against the baselines users run today, and the time the search takes.

For every big model the synth catalogue writes (header-only) and each device set, prints the
estimated tg and pp (t/s, a 4096-token prompt, goal balanced) of: the fastest plan
(``core.speed.fastest``), ``--cpu-moe``, the best ``--n-cpu-moe N`` and llama.cpp's ``--fit``, and
the search time (CPU time of this process; the machine is shared) as a ratio to one full projection
of the model measured in the same run, with and without the llama.cpp --fit baseline (its port's
own dry runs), the full projections and the predicted evaluations (the issue's target: the search
under one second for DeepSeek-V3 with four GPUs).  Host: 8 channels of
DDR5-4800, 32 threads; GPUs: RTX 3090 / 4090 / A100 80GB figures from the speed catalogue.

    python bench/fit_vs_baselines.py [--models DeepSeek-V3-Q4_K_M,...] [--sets 1x24,...] [--markdown]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import project
from offload_planner.core.placement import place
from offload_planner.core.plan import plan_from_args
from offload_planner.core.speed.fastest import fastest_plan
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.synth import BIG_MODELS, write_model
from offload_planner.core.synth.spec import ModelSpec

_DSV3 = BIG_MODELS["DeepSeek-V3-Q4_K_M"]
#: Kimi K2: DeepSeek-V3's architecture with 384 experts, 64 heads, one dense lead layer, a 163840-token
#: vocabulary, rope_theta 50000 with yarn x64 over 4096
#: (https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json: hidden_size 7168,
#: num_hidden_layers 61, num_attention_heads 64, vocab_size 163840, n_routed_experts 384,
#: num_experts_per_tok 8, first_k_dense_replace 1, n_group 1, topk_group 1)
KIMI_K2 = replace(
    _DSV3, name="Kimi K2", n_head=64, n_expert=384, n_layer_dense_lead=1, n_ctx_train=131072,
    rope_freq_base=50000.0, rope_scaling=replace(_DSV3.rope_scaling, factor=64.0),
    tokenizer=replace(_DSV3.tokenizer, n_vocab=163840, pre="kimi-k2"),
    extra_kv={**_DSV3.extra_kv, "expert_group_count": 1, "expert_group_used_count": 1},
)
MODELS: dict[str, ModelSpec] = {**{n: s for n, s in BIG_MODELS.items() if s.n_expert},
                                "Kimi-K2-Q4_K_M": KIMI_K2}

SETS = {
    "1x24": ["rtx3090"],
    "2x24": ["rtx3090", "rtx3090"],
    "24+12": ["rtx4090", "rtx3060"],
    "1x80": ["a100-80gb-pcie"],
    "4x24": ["rtx3090"] * 4,
}
CPU = "CPU=768GiB,ram=8xDDR5-4800"
BASE = ["-c", "32768", "-t", "32"]


def devices(cards: list[str]) -> DeviceSet:
    gpus = tuple(parse_device_decl(f"CUDA{i}={c}") for i, c in enumerate(cards))
    return DeviceSet(parse_device_decl(CPU), gpus)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--sets", default=",".join(SETS))
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if a.markdown:
            print("| model | devices | fastest tg / pp | --cpu-moe | best --n-cpu-moe | llama.cpp --fit "
                  "| search / projection |")
            print("|---|---|---|---|---|---|---|")
        for name in a.models.split(","):
            [path] = write_model(MODELS[name], Path(tmp) / f"{name}.gguf", header_only=True)
            model = open_model(str(path))
            for set_name in a.sets.split(","):
                ds = devices(SETS[set_name])
                base = plan_from_args(model, ds, parse_server_args(BASE))
                c0 = time.process_time()
                project(model, ds, place(model, ds, base.placement_options), base.context)
                proj_cpu = time.process_time() - c0
                t0, c0 = time.perf_counter(), time.process_time()
                r = fastest_plan(model, ds, BASE, hardware_for(ds, threads=32), goal="balanced")
                search_s, search_cpu = time.perf_counter() - t0, time.process_time() - c0
                cells = {}
                for c in r.candidates:
                    key = "fastest" if c is r.best and c.label.startswith("fastest") else c.label
                    if key.startswith("--n-cpu-moe"):
                        key = "--n-cpu-moe"
                    fit = "" if c.fits else (" (does not fit)" if c.verified else " (predicted not to fit)")
                    cells.setdefault(key, f"{c.estimate.tg_tps:.1f} / {c.estimate.pp_tps:.0f}{fit}"
                                     + (f" ({c.label})" if key == "--n-cpu-moe" else ""))
                best = r.best
                best_cell = "nothing fits" if best is None else (
                    f"{best.estimate.tg_tps:.1f} / {best.estimate.pp_tps:.0f} ({best.label})")
                fit_cpu = r.fit_seconds
                ratio = (f"CPU {search_cpu:.2f} s = {search_cpu / proj_cpu:.1f}x a projection "
                         f"({proj_cpu:.2f} s), of which llama.cpp --fit {fit_cpu:.2f} s: search alone "
                         f"{search_cpu - fit_cpu:.2f} s = {(search_cpu - fit_cpu) / proj_cpu:.1f}x; "
                         f"wall {search_s:.2f} s; {r.projections} full projections, "
                         f"{r.evaluations} predicted")
                row = [name, set_name, best_cell, cells.get("--cpu-moe", "-"), cells.get("--n-cpu-moe", "-"),
                       cells.get("llama.cpp --fit", "-"), ratio]
                print("| " + " | ".join(row) + " |" if a.markdown else "  ".join(row), flush=True)


if __name__ == "__main__":
    main()
