"""ik_llama.cpp's llama-server flags, transcribed from ``common/common.cpp: gpt_params_find_arg``.

Read from ikawrakow/ik_llama.cpp at commit 007d6400 (2026; has ``--spec-type`` stages, ``--fit``,
``-gfm``, ``-muge``, ``-no-ooae``).  ik has no ``common_arg`` table: every ``if (arg == ...)`` branch
is a flag; ``CHECK_ARG`` marks one that takes a value.  The environment is read separately, only
for the variables in :data:`IK_ENV` (``gpt_params_parse_from_env``), before the command line.
"""

from __future__ import annotations

from offload_planner.core.cmdline.flagspec import FlagSpec, ValueKind

_N, _V, _P = ValueKind.NONE, ValueKind.STRING, ValueKind.PAIR

# (spellings, kind); the first "--" spelling is the canonical key, as for mainline.
_IK: tuple[tuple[str, ValueKind], ...] = (
    ("-s --seed", _V), ("-t --threads", _V), ("-tb --threads-batch", _V), ("-tm --threads-mtmd", _V),
    ("-td --threads-draft", _V), ("-tbd --threads-batch-draft", _V), ("-p --prompt", _V),
    ("-e --escape", _N), ("--no-escape", _N), ("--prompt-cache", _V), ("--prompt-cache-all", _N),
    ("--prompt-cache-ro", _N), ("-bf --binary-file", _V), ("-f --file", _V), ("--in-file", _V),
    ("-n --predict --n-predict", _V), ("--top-k", _V), ("-c --ctx-size", _V),
    ("-cd --ctx-size-draft", _V), ("-gan --grp-attn-n", _V), ("-gaw --grp-attn-w", _V),
    ("--rope-freq-base", _V), ("--rope-freq-scale", _V), ("--rope-scaling", _V), ("--rope-scale", _V),
    ("--yarn-orig-ctx", _V), ("--yarn-ext-factor", _V), ("--yarn-attn-factor", _V),
    ("--yarn-beta-fast", _V), ("--yarn-beta-slow", _V), ("--pooling", _V), ("--attention", _V),
    ("-dt --defrag-thold", _V), ("-mea --max-extra-alloc", _V), ("-nrep --n-repetitions", _V),
    ("--samplers", _V), ("--sampling-seq", _V), ("--top-p", _V), ("--min-p", _V), ("--temp", _V),
    ("--tfs", _V), ("--typical", _V), ("--repeat-last-n", _V), ("--repeat-penalty", _V),
    ("--frequency-penalty", _V), ("--presence-penalty", _V), ("--dynatemp-range", _V),
    ("--dynatemp-exp", _V), ("--mirostat", _V), ("--mirostat-lr", _V), ("--mirostat-ent", _V),
    ("--xtc-probability", _V), ("--xtc-threshold", _V), ("--top-n-sigma", _V),
    ("--dry-multiplier", _V), ("--dry-base", _V), ("--dry-allowed-length", _V),
    ("--dry-penalty-last-n", _V), ("--dry-sequence-breaker", _V), ("--adaptive-target", _V),
    ("--adaptive-decay", _V), ("--adaptive-updt-w-cur", _N), ("--spec-replace", _P),
    ("--cfg-negative-prompt", _V), ("--cfg-negative-prompt-file", _V), ("--cfg-scale", _V),
    ("-b --batch-size", _V), ("-ub --ubatch-size", _V), ("--keep", _V),
    ("--draft --draft-max --draft-n", _V), ("--draft-min --draft-n-min", _V), ("--draft-p-min", _V),
    ("--spec-ckpt-mode --recurrent-ckpt-mode", _V), ("--spec-autotune", _N), ("--chunks", _V),
    ("-np --parallel", _V),
    ("-ns --sequences", _V), ("-ps --p-split", _V), ("-m --model", _V), ("-md --model-draft", _V),
    ("--spec-stage", _V), ("--spec-type", _V), ("--spec-ngram-size-n", _V), ("--spec-ngram-size-m", _V),
    ("--spec-ngram-min-hits", _V), ("--suffix-pattern-len", _V), ("--suffix-max-depth", _V),
    ("--suffix-corpus", _V), ("-a --alias", _V), ("-mu --model-url", _V), ("-hft --hf-token", _V),
    ("-hfr --hf-repo", _V), ("-hff --hf-file", _V), ("--lora", _V), ("--lora-scaled", _P),
    ("--lora-init-without-apply", _N), ("--control-vector", _V), ("--control-vector-scaled", _P),
    ("--control-vector-layer-range", _P), ("--mmproj", _V), ("--mmproj-url", _V),
    ("--no-mmproj-offload", _N), ("--mtmd-kq-type", _V), ("--image --audio", _V),
    ("--image-min-tokens", _V), ("--image-max-tokens", _V), ("-i --interactive", _N),
    ("-sp --special", _N), ("--embedding --embeddings", _N), ("--embd-normalize", _V),
    ("--embd-output-format", _V), ("--embd-separator", _V), ("-if --interactive-first", _N),
    ("-cnv --conversation", _N), ("--infill", _N), ("-dkvc --dump-kv-cache", _N),
    ("-nkvo --no-kv-offload", _N), ("-ctk --cache-type-k", _V), ("-ctv --cache-type-v", _V),
    ("-ctk-first --cache-type-k-first", _V), ("-ctk-last --cache-type-k-last", _V),
    ("-ctv-first --cache-type-v-first", _V), ("-ctv-last --cache-type-v-last", _V),
    ("-mtprot --mtp-requantize-output-tensor", _V), ("-ctkd --cache-type-k-draft", _V),
    ("-ctvd --cache-type-v-draft", _V), ("-mli --multiline-input", _N), ("--simple-io", _N),
    ("-cb --cont-batching", _N), ("-nocb --no-cont-batching", _N), ("-no-fa --no-flash-attn", _N),
    ("-fa --flash-attn", _V), ("-mla --mla-use", _V), ("-amb --attention-max-batch", _V),
    ("-no-fmoe --no-fused-moe", _N), ("-ger --grouped-expert-routing", _N),
    ("-no-fug --no-fused-up-gate", _N), ("-no-mmad --no-fused-mul-multiadd", _N),
    ("-rcache --rope-cache", _N), ("-gr --graph-reuse", _N), ("-no-gr --no-graph-reuse", _N),
    ("-ser --smart-expert-reduction", _V), ("-co --color", _N), ("--mlock", _N),
    ("-ngl --gpu-layers --n-gpu-layers", _V), ("-ngld --gpu-layers-draft --n-gpu-layers-draft", _V),
    ("-mg --main-gpu", _V), ("--max-gpu", _V), ("-sm --split-mode", _V), ("-ts --tensor-split", _V),
    ("--rpc", _V), ("-okv --override-kv", _V), ("-ot --override-tensor", _V), ("-gfm --gpu-fit-margin", _V),
    ("-cuda --cuda-params", _V), ("-mtp --multi-token-prediction", _N),
    ("-no-mtp --no-multi-token-prediction", _N), ("-draft --draft-params", _V),
    ("-cmoe --cpu-moe", _N), ("-ncmoe --n-cpu-moe", _V), ("--fit", _N), ("--defer-experts", _N),
    ("--fit-margin", _V), ("-wgt --worst-graph-tokens", _V), ("--no-mmap", _N),
    ("-rtr --run-time-repack", _N), ("-thp --transparent-huge-pages", _N),
    ("-vq --validate-quants", _N), ("-mqkv --merge-qkv", _N), ("-muge --merge-up-gate-experts", _N),
    ("-khad --k-cache-hadamard", _N), ("-vhad --v-cache-hadamard", _N),
    ("-smgs --split-mode-graph-scheduling", _N), ("-sas --scheduler-async", _N),
    ("-fdn --fused-delta-net", _V), ("-smf16 --split-mode-f16", _N), ("-smf32 --split-mode-f32", _N),
    ("-grt --graph-reduce-type", _V), ("-gap --graph-attn-precision", _V), ("--numa", _V),
    ("-dev --device", _V), ("-devd --device-draft", _V), ("-v --verbose", _N), ("--verbosity", _V),
    ("--verbose-prompt", _N), ("--no-display-prompt", _N), ("-r --reverse-prompt", _V),
    ("--banned-string-file", _V), ("--banned-n", _V), ("--allowlist-unicode-rule", _V),
    ("--allowlist-pieces", _V), ("--allowlist-keyword", _V), ("--allowlist-keyword-delay", _V),
    ("--expiring-logit-bias-file", _V), ("-ld --logdir", _V), ("-lcs --lookup-cache-static", _V),
    ("-lcd --lookup-cache-dynamic", _V), ("--save-all-logits --kl-divergence-base", _V),
    ("--perplexity --all-logits", _N), ("--ppl-stride", _V), ("--ppl-output-type", _V),
    ("-ptc --print-token-count", _V), ("--check-tensors", _N), ("--hellaswag", _N),
    ("--hellaswag-tasks", _V), ("--winogrande", _N), ("--winogrande-tasks", _V),
    ("--multiple-choice", _N), ("--multiple-choice-tasks", _V), ("--kl-divergence", _N),
    ("--ignore-eos", _N), ("--penalize-nl", _N), ("-l --logit-bias", _V), ("-h --help --usage", _N),
    ("--version", _N), ("-dr --dry-run", _N), ("--in-prefix-bos", _N), ("--in-prefix", _V),
    ("--in-suffix", _V), ("--spm-infill", _N), ("--grammar", _V), ("--grammar-file", _V),
    ("-j --json-schema", _V), ("-op --offload-policy", _V),
    ("-no-ooae --no-offload-only-active-experts", _N), ("--host", _V), ("--port", _V),
    ("--send-done", _N), ("--path", _V), ("--webui", _V), ("--webui-mcp-proxy --ui-mcp-proxy", _N),
    ("--api-key", _V), ("--api-key-file", _V), ("--ssl-key-file", _V), ("--ssl-cert-file", _V),
    ("-to --timeout", _V), ("--threads-http", _V), ("-spf --system-prompt-file", _V),
    ("--log-format", _V), ("--no-slots", _N), ("--metrics", _N), ("--slot-save-path", _V),
    ("--reasoning-tokens", _V), ("--reasoning-budget", _V), ("--sql-save-file", _V),
    ("--sqlite-zstd-ext-file", _V), ("--chat-template", _V), ("--chat-template-file", _V),
    ("--jinja", _N), ("--peg", _N), ("--chat-template-kwargs", _V), ("--reasoning-format", _V),
    ("-rea --reasoning", _V), ("--reasoning-budget-message", _V), ("--skip-chat-parsing", _V),
    ("--no-prefill-assistant", _V), ("--parallel-tool-calls", _N),
    ("-sps --slot-prompt-similarity", _V), ("-pps", _N), ("-npp", _V), ("-ntg", _V), ("-npl", _V),
    ("--context-file", _V), ("--chunk-size", _V), ("--chunk-separator", _V), ("--junk", _V),
    ("--no-context-shift", _N), ("--context-shift", _V), ("--ctx-checkpoints", _V),
    ("--ctx-checkpoints-interval", _V), ("--ctx-checkpoints-tolerance", _V), ("-cram --cache-ram", _V),
    ("-crs --cache-ram-similarity", _V), ("-cram-n-min --cache-ram-n-min", _V), ("--pos", _V),
    ("-o --output --output-file", _V), ("--output-draft --draft-output --draft-output-file", _V),
    ("-ofreq --output-frequency", _V), ("--save-frequency", _V), ("--process-output", _N),
    ("--output-tensor-name", _V), ("--no-ppl", _N), ("--chunk --from-chunk", _V),
    ("--positive-file", _V), ("--negative-file", _V), ("--pca-batch", _V), ("--pca-iter", _V),
    ("--method", _V), ("--no-warmup", _N), ("-wb --warmup-batch", _N), ("--output-format", _V),
    ("--minilog", _N),
    # log.h: log_param_single_parse / log_param_pair_parse
    ("--log-test", _N), ("--log-disable", _N), ("--log-enable", _N), ("--log-new", _N),
    ("--log-append", _N), ("--log-file", _V),
)  # fmt: skip

# gpt_params_parse_from_env: variable -> (flag key, C++ type of the field it sets)
IK_ENV: dict[str, tuple[str, str]] = {
    "LLAMA_ARG_MODEL": ("--model", "string"),
    "LLAMA_ARG_MODEL_URL": ("--model-url", "string"),
    "LLAMA_ARG_MODEL_ALIAS": ("--alias", "string"),
    "LLAMA_ARG_HF_REPO": ("--hf-repo", "string"),
    "LLAMA_ARG_HF_FILE": ("--hf-file", "string"),
    "LLAMA_ARG_THREADS": ("--threads", "int"),
    "LLAMA_ARG_CTX_SIZE": ("--ctx-size", "int"),
    "LLAMA_ARG_N_PARALLEL": ("--parallel", "int"),
    "LLAMA_ARG_BATCH": ("--batch-size", "int"),
    "LLAMA_ARG_UBATCH": ("--ubatch-size", "int"),
    "LLAMA_ARG_N_GPU_LAYERS": ("--gpu-layers", "int"),
    "LLAMA_ARG_THREADS_HTTP": ("--threads-http", "int"),
    "LLAMA_ARG_CHAT_TEMPLATE": ("--chat-template", "string"),
    "LLAMA_ARG_N_PREDICT": ("--predict", "int"),
    "LLAMA_ARG_ENDPOINT_METRICS": ("--metrics", "bool"),
    "LLAMA_ARG_ENDPOINT_SLOTS": ("--no-slots", "bool"),
    "LLAMA_ARG_EMBEDDINGS": ("--embedding", "bool"),
    "LLAMA_ARG_FLASH_ATTN": ("--flash-attn", "bool"),
    "LLAMA_ARG_DEFRAG_THOLD": ("--defrag-thold", "float"),
    "LLAMA_ARG_CONT_BATCHING": ("--cont-batching", "bool"),
    "LLAMA_ARG_HOST": ("--host", "string"),
    "LLAMA_ARG_PORT": ("--port", "int"),
    "LLAMA_ARG_CACHE_TYPE_K": ("--cache-type-k", "string"),
    "LLAMA_ARG_CACHE_TYPE_V": ("--cache-type-v", "string"),
    "LLAMA_ARG_MLOCK": ("--mlock", "bool"),
    "LLAMA_ARG_K_CACHE_HADAMARD": ("--k-cache-hadamard", "bool"),
    "LLAMA_ARG_V_CACHE_HADAMARD": ("--v-cache-hadamard", "bool"),
}

# Flags whose value ik reads with ``argv[++i]`` and no CHECK_ARG (a missing value reads past argv).
IK_UNCHECKED_VALUE = frozenset(
    {"--cache-type-k", "--cache-type-v", "--cache-type-k-draft", "--cache-type-v-draft"}
)

IK_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1", "q6_0", "q8_KV")


def _env_for(key: str) -> str | None:
    for env, (flag, _kind) in IK_ENV.items():
        if flag == key:
            return env
    return None


def _spec(names: str, kind: ValueKind) -> FlagSpec:
    spec = FlagSpec(names=tuple(names.split()), kind=kind)
    return FlagSpec(names=spec.names, kind=kind, env=_env_for(spec.key))


IK_FLAGS: tuple[FlagSpec, ...] = tuple(_spec(names, kind) for names, kind in _IK)

#: Speculative-decoding spellings ik_llama.cpp's parser did not have before PR 645 (2025-08-15: speculative
#: decoding ported to llama-server) and the stages after it: read at 639aee23c (2025-05-25) and
#: 305fe4b16 (2025-06-27), whose ``gpt_params_find_arg`` knew only ``-td``, ``-tbd``, ``--draft N``,
#: ``-ps/--p-split``, ``-md/--model-draft`` and ``-ngld/--gpu-layers-draft`` of them (the speculative
#: example's; that server never read them): "error: unknown argument" there.
IK_2025_ABSENT_SPEC = frozenset({
    "--spec-type", "--spec-stage", "--spec-ngram-size-n", "--spec-ngram-size-m", "--spec-ngram-min-hits",
    "--spec-autotune", "--spec-ckpt-mode", "--recurrent-ckpt-mode", "--spec-replace", "--suffix-pattern-len",
    "--suffix-max-depth", "--suffix-corpus", "--draft-max", "--draft-n", "--draft-min", "--draft-n-min",
    "--draft-p-min", "-cd", "--ctx-size-draft", "-ctkd", "--cache-type-k-draft", "-ctvd",
    "--cache-type-v-draft", "-devd", "--device-draft", "-draft", "--draft-params", "--n-gpu-layers-draft",
    "-mtp", "--multi-token-prediction", "-no-mtp", "--no-multi-token-prediction", "-mtprot",
    "--mtp-requantize-output-tensor",
})


def _without(flags: tuple[FlagSpec, ...], absent: frozenset[str]) -> tuple[FlagSpec, ...]:
    out = []
    for spec in flags:
        names = tuple(n for n in spec.names if n not in absent)
        if names:
            out.append(spec if names == spec.names else FlagSpec(names=names, kind=spec.kind, env=spec.env))
    return tuple(out)


#: ik_llama.cpp's flags as builds before July 2025 take them (:mod:`dialects.ik_2025`): the current
#: table less :data:`IK_2025_ABSENT_SPEC` (other flags new since are still accepted: the table is
#: approximate there)
IK_2025_FLAGS: tuple[FlagSpec, ...] = _without(IK_FLAGS, IK_2025_ABSENT_SPEC)
