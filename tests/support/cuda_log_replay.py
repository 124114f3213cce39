"""Replay a public CUDA load log (tests/data/cuda_logs/public_cuda_logs.json) through the planner.

For one record: read the model's hyper-parameters from the log's ``print_info`` /
``llm_load_print_meta`` and ``llama_model_loader: - kv`` lines, write the model header-only with
:mod:`offload_planner.core.synth` (tensor types from a per-record quant recipe whose type counts
must equal the log's ``type X: N tensors`` lines), declare the logged CUDA devices with their
logged free memory, run the planner's engine with the logged flags in the build's dialect, and
compare every logged buffer with the projected one of the same buffer type and kind.
"""

from __future__ import annotations

import re
import shlex
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gguf import GGMLQuantizationType as Q

from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.engine import context_params, placement_options
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection, project
from offload_planner.core.placement import place
from offload_planner.core.synth.ik_types import IkQ
from offload_planner.core.synth.quant import pick_type
from offload_planner.core.synth.spec import (
    ModelSpec,
    QType,
    QuantMix,
    RopeScaling,
    TokenizerKind,
    TokenizerSpec,
)
from offload_planner.core.synth.tensors import tensor_defs
from offload_planner.core.synth.writer import write_model
from offload_planner.core.units import MiB

#: Tolerances of the comparison (relative), per buffer kind.
TOLERANCE = {"model": 0.01, "kv": 0.01, "output": 0.01, "compute": 0.10, "host compute": 0.10}
KINDS = tuple(TOLERANCE)

_META_RE = re.compile(r"(?:print_info|llm_load_print_meta):\s+(\w+)\s+=\s+(\S+)")
_KV_RE = re.compile(r"llama_model_loader: - kv\s+\d+:\s+([\w.]+)\s+\S+\s+=\s+(\S+)")
_TYPE_RE = re.compile(r"llama_model_loader: - type\s+(\w+):\s+(\d+) tensors")
_FREE_RE = re.compile(r"using device (CUDA\d+) \((.*?)\) - (\d+) MiB free")
QK_NORM_ARCHS = frozenset({"qwen3", "qwen3moe", "gemma3"})
TIED_ARCHS = frozenset({"gemma3"})  # no output.weight: the token embedding doubles as the output
BIAS_ARCHS = frozenset({"gpt-oss"})  # q/k/v/o biases
_FTYPE = {"f16": 1, "q4_0": 2, "q8_0": 7, "q2_k": 10, "q6_k": 18}


def log_hparams(log: str) -> dict[str, str]:
    """``print_info`` / ``llm_load_print_meta`` values and ``<arch>.*`` kv values of a log."""
    out = {m[1]: m[2] for m in _META_RE.finditer(log)}
    for m in _KV_RE.finditer(log):
        out.setdefault("kv:" + m[1], m[2])
    return out


def log_type_counts(log: str) -> dict[str, int]:
    return {m[1].lower(): int(m[2]) for m in _TYPE_RE.finditer(log)}


def log_free_mib(log: str) -> dict[str, int]:
    return {m[1]: int(m[3]) for m in _FREE_RE.finditer(log)}


@dataclass(frozen=True)
class Recipe:
    """What the log does not state as a number and the replay needs: which role has which type (the
    test checks the resulting type counts against the log), the dialect of the build, extra flags."""

    quant: dict[str, str]  # QuantMix slot -> ggml type name
    dialect: str = "llama.cpp-2025-early"  # mainline before b6050: every mainline record but one
    hparams_from: str | None = None  # sibling record whose log prints the same model's header
    types_from: str | None = None  # sibling record whose log prints the same file's type counts
    extra_args: tuple[str, ...] = ()
    kv: dict[str, Any] = field(default_factory=dict)  # extra <arch>.* keys (e.g. use_parallel_residual)
    gpu_mib: tuple[int, ...] = ()  # memory of the logged GPUs when the log prints no free memory
    drop_flags: tuple[str, ...] = ()  # value-less flags of the log's build the dialect no longer has
    output_first: bool = False  # the file lists output.weight before the token embedding (HF lm_head first)
    kv_b_and_split: bool = False  # a 2025 ik-converted DeepSeek file: attn_kv_b and attn_k_b/attn_v_b
    types_unknown: bool = False  # the excerpt prints no type counts: the weights are written but not compared


def _int(h: dict[str, str], key: str, default: int = 0) -> int:
    v = h.get(key)
    return int(v) if v is not None and re.fullmatch(r"-?\d+", v) else default


def _qtype(name: str) -> QType:
    return IkQ[name.upper()] if name.upper() in IkQ.__members__ else Q[name.upper()]


#: deepseek2 values ``llm_load_print_meta`` prints after the common block, and the keys they come from
_DEEPSEEK2_KV = {"expert_weights_scale": float, "expert_weights_norm": lambda v: v in ("1", "true")}
_GATING = {"softmax": 1, "sigmoid": 2}


def _deepseek2(h: dict[str, str]) -> dict[str, Any]:
    """The MLA / shared-expert fields of a deepseek2 header (empty for other architectures)."""
    if h.get("arch") != "deepseek2":
        return {}
    kv: dict[str, Any] = {k: f(h[k]) for k, f in _DEEPSEEK2_KV.items() if k in h}
    if h.get("expert_gating_func") in _GATING:
        kv["expert_gating_func"] = _GATING[h["expert_gating_func"]]
    return {"q_lora_rank": _int(h, "n_lora_q"), "kv_lora_rank": _int(h, "n_lora_kv"),
            "n_expert_shared": _int(h, "n_expert_shared"),
            "n_layer_dense_lead": _int(h, "n_layer_dense_lead"),
            "extra_kv": kv}


def model_spec(record: dict[str, Any], h: dict[str, str], recipe: Recipe) -> ModelSpec:
    arch = h["arch"]
    n_embd, n_head = _int(h, "n_embd"), _int(h, "n_head")
    head_k = _int(h, "n_embd_head_k") or n_embd // n_head
    slots = {k: _qtype(v) for k, v in recipe.quant.items()}
    f32 = Q.F32
    mix = QuantMix(name=record["id"], ftype=_FTYPE.get(recipe.quant.get("attn", "f16"), 1),
                   embd=slots["embd"], output=slots["output"], attn=slots["attn"],
                   attn_v=slots.get("attn_v", slots["attn"]), ffn=slots.get("ffn", slots["attn"]),
                   ffn_down=slots.get("ffn_down", slots.get("ffn", slots["attn"])),
                   shexp=slots.get("shexp", f32), shexp_down=slots.get("shexp_down", f32),
                   exps=slots.get("exps", f32), exps_down=slots.get("exps_down", slots.get("exps", f32)),
                   nextn=slots.get("nextn", f32), more_bits=slots.get("more_bits"))
    eps = float(h.get("f_norm_eps", "1e-5")) if arch == "gptneox" else float(h.get("f_norm_rms_eps", "1e-6"))
    yarn = None
    if h.get("rope") == "yarn" or h.get("kv:" + arch + ".rope.scaling.type") == "yarn":
        log_mul = float(h["rope_yarn_log_mul"]) if "rope_yarn_log_mul" in h else None
        yarn = RopeScaling("yarn", 1 / float(h.get("freq_scale_train", "1")), _int(h, "n_ctx_orig_yarn"),
                           log_mul)
    ds = _deepseek2(h)
    return ModelSpec(
        name=record["model"]["name"], arch=arch, sliding_window=_int(h, "n_swa"),
        sliding_window_pattern=_int(h, "n_swa_pattern") or None, tied_embeddings=arch in TIED_ARCHS,
        attn_bias=arch in BIAS_ARCHS, rope_scaling=yarn, n_layer=_int(h, "n_layer"), n_embd=n_embd,
        n_head=n_head, n_head_kv=_int(h, "n_head_kv", n_head), n_ctx_train=_int(h, "n_ctx_train"),
        n_ff=_int(h, "n_ff"), head_dim_k=head_k, head_dim_v=_int(h, "n_embd_head_v") or head_k,
        n_rot=_int(h, "n_rot") or None, n_expert=_int(h, "n_expert"), n_expert_used=_int(h, "n_expert_used"),
        n_ff_exp=_int(h, "n_ff_exp"), rope_freq_base=float(h.get("freq_base_train", "10000")), rms_eps=eps,
        tokenizer=TokenizerSpec(TokenizerKind.BPE, _int(h, "n_vocab"), n_merges=_int(h, "n_merges")),
        quant=mix, extra_kv={**ds.pop("extra_kv", {}), **recipe.kv}, qk_norm=arch in QK_NORM_ARCHS,
        output_first=recipe.output_first, kv_b_and_split=recipe.kv_b_and_split, **ds,
    )


def spec_type_counts(spec: ModelSpec) -> dict[str, int]:
    return dict(Counter(pick_type(spec, td).name.lower() for td in tensor_defs(spec)))


#: Flags of the logged tools (llama-cli, -perplexity, -imatrix) that llama-server lacks, with their value
#: count; they do not change the buffers and are dropped before parsing.
TOOL_FLAGS = {"-o": 1, "--layer-similarity": 0, "--output-tensor-name": 1, "--verbosity": 1, "-p": 1,
              "--prompt": 1, "-f": 1, "--file": 1, "--chunks": 1, "-n": 1, "--n-predict": 1,
              "--ignore-eos": 0, "-no-cnv": 0, "--no-conversation": 0}


def command_argv(command: str) -> list[str]:
    """The logged command's arguments (shell quoting and line continuations resolved, the shell prompt,
    environment assignments and the program removed, tool-only flags dropped)."""
    tokens = shlex.split(command.replace("\\\n", " "))
    start = next(i for i, t in enumerate(tokens) if "llama-" in t.rsplit("/", 1)[-1])
    out: list[str] = []
    it = iter(tokens[start + 1:])
    for t in it:
        if t in TOOL_FLAGS:
            for _ in range(TOOL_FLAGS[t]):
                next(it, None)
            continue
        out.append(t)
    return out


def server_argv(record: dict[str, Any], recipe: Recipe) -> list[str]:
    """The logged command, then the logged context as flags (the tool's own defaults differ from the
    server's: one sequence, the logged -c/-b/-ub and flash attention state)."""
    c = record["context"]
    logged = command_argv(record["command"]) if record["command"] else []
    argv = [a for a in logged if a not in recipe.drop_flags]
    for flag, key in (("-c", "n_ctx"), ("-b", "n_batch"), ("-ub", "n_ubatch")):
        if c[key] is not None:  # None: the excerpt does not print it (the command's value stands)
            argv += [flag, str(c[key])]
    argv += ["-np", "1"]
    if c["flash_attn"] is not None:
        argv += ["-fa", "on" if c["flash_attn"] else "off"]
    if c["n_gpu_layers"] is not None:
        argv += ["-ngl", str(c["n_gpu_layers"])]
    if c["type_k"]:
        argv += ["-ctk", c["type_k"]]
    if c["type_v"]:
        argv += ["-ctv", c["type_v"]]
    return argv + list(recipe.extra_args)


def devices_of(record: dict[str, Any], sibling_log: str = "", gpu_mib: tuple[int, ...] = ()) -> DeviceSet:
    """The logged CUDA devices with their logged free memory (else the cards' memory the recipe
    states, else the free memory a sibling run of the same CI job on the same GPU printed)."""
    free = log_free_mib(record["log"]) or {f"CUDA{i}": mib for i, mib in enumerate(gpu_mib)} or log_free_mib(
        sibling_log)
    assert len(free) == max(len(record["gpus"]), 1), (record["id"], free)
    gpus = tuple(Device(name, DeviceKind.CUDA, total=mib * MiB, free=mib * MiB) for name, mib in free.items())
    return DeviceSet(Device("CPU", DeviceKind.CPU, total=256 << 30, free=256 << 30), gpus)


@dataclass
class Row:
    kind: str
    buft: str
    logged: float  # MiB
    projected: float | None  # MiB; None: no such buffer projected

    @property
    def error(self) -> float:
        if self.projected is None:
            return 1.0
        if self.logged == 0:
            return 0.0 if self.projected < 0.01 else 1.0
        return abs(self.projected - self.logged) / self.logged


def kind_of(device: str, kind: str) -> str:
    """``host compute`` for the CPU side's compute buffer (``CUDA_Host`` or ``CPU``)."""
    on_host = not device.startswith("CUDA") or device.endswith("_Host")
    return "host compute" if kind == "compute" and on_host else kind


def compare(record: dict[str, Any], projected: list[tuple[str, str, float]]) -> list[Row]:
    """Every logged buffer against the projected buffer of the same buffer type and kind (the shards'
    mmap buffers of a split file summed: the replay writes one file, the shard cut points are unknown);
    projected
    buffers of a kind the excerpt logs that the log does not have are rows with logged 0."""
    got: dict[tuple[str, str], float] = {}
    for buft, kind, mib in projected:
        got[(buft, kind)] = got.get((buft, kind), 0.0) + mib
    logged: dict[tuple[str, str], float] = {}
    for b in record["buffers"]:  # a split file logs one CPU_Mapped buffer per shard: compare the sum
        logged[(b["device"], b["kind"])] = logged.get((b["device"], b["kind"]), 0.0) + b["mib"]
    rows = [Row(kind_of(*key), key[0], round(mib, 2), got.pop(key, None)) for key, mib in logged.items()]
    logged_kinds = {b["kind"] for b in record["buffers"]}  # an excerpt may leave a kind out
    rows += [Row(kind_of(*k), k[0], 0.0, v) for k, v in got.items() if v >= 0.01 and k[1] in logged_kinds]
    return rows


def project_record(record: dict[str, Any], h: dict[str, str], recipe: Recipe, tmp: Path,
                   sibling_log: str = "") -> tuple[list[tuple[str, str, float]], Projection]:
    spec = model_spec(record, h, recipe)
    path = tmp / f"{record['id']}.gguf"
    write_model(spec, path, header_only=True)
    model = open_model(path)
    parsed = parse_server_args(server_argv(record, recipe), dialect=recipe.dialect)
    assert parsed.ok, parsed.errors
    devices = devices_of(record, sibling_log, recipe.gpu_mib)
    popts = placement_options(model, devices, parsed, recipe.dialect)
    cparams, _ = context_params(model, parsed, recipe.dialect)
    if not is_server(record):
        # llama-cli / -perplexity / -save-load-state leave n_outputs_max 0: n_batch (llama-context.cpp)
        cparams = replace(cparams, n_outputs_max=None)
    projection = project(model, devices, place(model, devices, popts), cparams)
    out = []
    for mem in projection.devices:
        for b in mem.buffers:
            if b.kind in ("model", "kv", "output", "compute"):
                out.append((b.name, b.kind, b.bytes / MiB))
    return out, projection


def is_server(record: dict[str, Any]) -> bool:
    return "llama-server" in (record["command"] or "")
