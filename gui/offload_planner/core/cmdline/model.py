"""What a parsed llama-server command line holds: typed settings, overrides, refusals."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from offload_planner.core.dialects.base import Dialect

GPU_LAYERS_AUTO = -1  # mainline ``-ngl auto``
GPU_LAYERS_ALL = -2  # mainline ``-ngl all``


class Stage(StrEnum):
    """When llama-server refuses: while reading its arguments, or later while loading the model."""

    PARSE = "parse"
    LOAD = "load"


@dataclass(frozen=True)
class ArgError:
    """Something llama-server refuses.

    ``message`` is llama-server's own first line where it was verified against the real binary
    (see the tests); ``explanation`` is ours.  ``flag`` is the spelling as given (an env variable
    name for an environment setting) and ``value`` its value.
    """

    flag: str
    value: str | None
    message: str
    stage: Stage = Stage.PARSE
    explanation: str = ""

    def __str__(self) -> str:
        return f"{self.message} ({self.explanation})" if self.explanation else self.message


@dataclass(frozen=True)
class ArgWarning:
    """Accepted, but probably not what was meant (or llama-server warns about it)."""

    flag: str
    value: str | None
    message: str
    explanation: str = ""

    def __str__(self) -> str:
        return f"{self.message} ({self.explanation})" if self.explanation else self.message


@dataclass(frozen=True)
class TensorOverride:
    """One ``<pattern>=<buffer type>`` entry; ``source`` is the flag that produced it.

    ``index`` is the argv position of that flag (-1 for an environment variable, -2 for an entry
    ik_llama.cpp generates itself after the user's ``-ot`` entries).
    """

    pattern: str
    buft: str
    source: str
    index: int = -1


@dataclass(frozen=True)
class FlagUse:
    """One flag as it appeared: spelling, canonical key, values, and where."""

    spelling: str
    key: str
    values: tuple[str, ...]
    index: int  # argv index (program name excluded); -1 when it came from the environment
    positive: bool = True
    env: str | None = None


@dataclass
class DraftArgs:
    """Speculative decoding: the draft model and its own placement (``-md``, ``-ngld``, ``-devd``,
    ``-otd``/``-cmoed``/``-ncmoed``, ``-ctkd``/``-ctvd``), the draft length and ``--spec-type``.
    ``None`` means "not given"."""

    model: str | None = None
    n_gpu_layers: int | None = None  # -1 auto, -2 all
    devices: list[str] | None = None  # ["none"] for -devd none
    overrides: list[TensorOverride] = field(default_factory=list)
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    n_max: int | None = None  # --spec-draft-n-max (2025: --draft-max)
    p_min: float | None = None  # --spec-draft-p-min: a draft stops below this probability
    ctx_size: int | None = None  # 2025 builds' -cd
    types: list[str] = field(default_factory=list)  # --spec-type, appended in order
    #: ik_llama.cpp: each --spec-type stage's (type, n_max, n_min) overrides (-1: not given)
    stages: list[tuple[str, int, int]] = field(default_factory=list)
    #: ik_llama.cpp: a --spec-type stage's ``p_min=P`` by stage type
    stage_p_min: dict[str, float] = field(default_factory=dict)
    params: str | None = None  # ik_llama.cpp's -draft/--draft-params: the draft's own command line
    #: ik_llama.cpp: the ``LLAMA_ARG_*`` variables it read (``IK_ENV``), which it applies again to the
    #: draft's parameters before ``-draft "ARGS"`` (``gpt_params_parse``, common/common.cpp 829-830)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class ServerArgs:
    """The settings a planner cares about.  ``None`` means "not given": apply the dialect's default."""

    model: str | None = None
    alias: str | None = None
    n_gpu_layers: int | None = None  # -1 auto, -2 all (mainline); 999 stays 999
    overrides: list[TensorOverride] = field(default_factory=list)
    n_cpu_moe: int | None = None
    cpu_moe: bool | None = None
    n_cpu_ffn: int | None = None
    tensor_split: list[float] | None = None
    split_mode: str | None = None
    main_gpu: int | None = None
    devices: list[str] | None = None  # ["none"] for -dev none
    ctx_size: int | None = None
    batch_size: int | None = None
    ubatch_size: int | None = None
    n_parallel: int | None = None
    kv_unified: bool | None = None
    flash_attn: str | None = None  # "on" / "off" / "auto"
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    no_kv_offload: bool | None = None
    load_mode: str | None = None  # auto|none|mmap|mlock|mmap+mlock|dio (older flags mapped)
    swa_full: bool | None = None
    fit: bool | None = None
    fit_target: list[int] | None = None  # MiB per device (one value = all devices)
    fit_ctx: int | None = None
    rpc_servers: list[str] | None = None
    no_op_offload: bool | None = None
    no_host: bool | None = None
    no_repack: bool | None = None
    verbosity: int | None = None
    host: str | None = None
    port: int | None = None
    # ik_llama.cpp
    mla: int | None = None
    amb: int | None = None
    rtr: bool | None = None
    ser: tuple[int, float] | None = None
    fused_moe: bool | None = None
    merge_qkv: bool | None = None
    merge_up_gate_exps: bool | None = None
    k_cache_hadamard: bool | None = None
    v_cache_hadamard: bool | None = None
    only_active_experts: bool | None = None
    offload_policy: list[tuple[int, int]] | None = None
    cuda_params: str | None = None
    max_gpu: int | None = None
    reduce_type: str | None = None
    fit_margin: int | None = None
    gpu_fit_margin: list[tuple[int, int]] | None = None
    worst_graph_tokens: int | None = None
    cache_type_k_first: tuple[str, int] | None = None
    cache_type_k_last: tuple[str, int] | None = None
    cache_type_v_first: tuple[str, int] | None = None
    cache_type_v_last: tuple[str, int] | None = None
    draft: DraftArgs = field(default_factory=DraftArgs)


@dataclass
class ParsedArgs:
    """The result of :func:`parse_server_args`.

    ``errors`` lists every refusal found, in argv order; llama-server itself stops at the first one.
    ``passthrough`` keeps every argument that is not a :class:`ServerArgs` field, verbatim, in order,
    with its values.
    """

    dialect: Dialect
    args: ServerArgs = field(default_factory=ServerArgs)
    passthrough: list[str] = field(default_factory=list)
    errors: list[ArgError] = field(default_factory=list)
    warnings: list[ArgWarning] = field(default_factory=list)
    flags: list[FlagUse] = field(default_factory=list)
    program: str | None = None

    @property
    def ok(self) -> bool:
        return not self.errors
