"""Turning flags into ``LLAMA_ARG_*`` environment variables (and back into what stays on argv).

llama-server reads its environment before the command line, one option at a time in the order
the options are defined, so an option moves to the environment only when that cannot change what
it means: it appears once, has an env form and a value that fits on one line.  The override flags
(``-ot``, ``--cpu-moe``, ``--n-cpu-moe``, ``--n-cpu-ffn``) share one first-match list: they move
all together, only if their command-line order is the order the environment would apply them in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from offload_planner.core.cmdline.flagspec import FlagSpec, ValueKind, normalize_spelling
from offload_planner.core.cmdline.quoting import CONTROL
from offload_planner.core.cmdline.tables import flag_table
from offload_planner.core.dialects.base import Dialect

OVERRIDE_KEYS = ("--override-tensor", "--cpu-moe", "--n-cpu-moe", "--n-cpu-ffn")


@dataclass(frozen=True)
class ArgGroup:
    """A flag with its values, or a lone token the table does not know."""

    tokens: tuple[str, ...]
    spec: FlagSpec | None = None
    positive: bool = True

    @property
    def values(self) -> tuple[str, ...]:
        return self.tokens[1:]


@dataclass
class EnvSplit:
    env: dict[str, str] = field(default_factory=dict)
    rest: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def group_args(args: Sequence[str], dialect: Dialect) -> list[ArgGroup]:
    """Split arguments (no program name) into flags with their values."""
    table = flag_table(dialect)
    groups: list[ArgGroup] = []
    i = 0
    while i < len(args):
        found = table.lookup(normalize_spelling(args[i]))
        if found is None:
            groups.append(ArgGroup((args[i],)))
            i += 1
            continue
        arity = found.spec.arity
        if dialect.bare_flash_attn and found.spec.key == "--flash-attn":
            nxt = args[i + 1] if i + 1 < len(args) else "-"
            arity = 0 if nxt.startswith("-") and nxt != "-1" else 1
        groups.append(ArgGroup(tuple(args[i : i + 1 + arity]), found.spec, found.positive))
        i += 1 + arity
    return groups


#: A value longer than this stays on argv: docker --env-file reads lines shorter than 64 KiB.
ENV_VALUE_MAX = 32 * 1024


def _one_line(values: Sequence[str]) -> bool:
    """Values an env file carries exactly and shows plainly: one line of printable UTF-8 (no control
    character, no undecodable byte), no surrounding white space, not too long."""
    return all(v == v.strip() and not CONTROL.search(v) and len(v) <= ENV_VALUE_MAX for v in values)


def _mainline_env(group: ArgGroup) -> tuple[str, str] | None:
    spec = group.spec
    if spec is None or spec.env is None or not _one_line(group.values):
        return None
    if spec.kind is ValueKind.NONE:
        return spec.env, "1"
    if spec.kind is ValueKind.BOOL:
        return spec.env, "1" if group.positive else "0"
    if spec.kind in (ValueKind.INT, ValueKind.STRING):
        if group.values:
            return spec.env, group.values[0]
        return (spec.env, "on") if spec.key == "--flash-attn" else None  # 2025's bare -fa
    return None


def _override_order_ok(groups: list[ArgGroup], table_order: dict[str, int]) -> bool:
    keys = [g.spec.key for g in groups if g.spec is not None and g.spec.key in OVERRIDE_KEYS]
    counts = Counter(keys)
    if any(n > 1 for k, n in counts.items() if k != "--override-tensor"):
        return False
    collapsed = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    if len(collapsed) != len(set(collapsed)):
        return False  # -ot entries interleaved with other override flags
    return collapsed == sorted(collapsed, key=lambda k: table_order[k])


def split_mainline(groups: list[ArgGroup], dialect: Dialect) -> EnvSplit:
    out = EnvSplit()
    table_order = {spec.key: n for n, spec in enumerate(flag_table(dialect))}
    counts = Counter(g.spec.key for g in groups if g.spec is not None)
    overrides_move = _override_order_ok(groups, table_order)
    if not overrides_move and any(g.spec is not None and g.spec.key in OVERRIDE_KEYS for g in groups):
        out.notes.append("override flags stay on the command line: the environment would reorder them")
    ot_values: list[str] = []
    for g in groups:
        key = g.spec.key if g.spec is not None else None
        pair = _mainline_env(g)
        if key in OVERRIDE_KEYS:
            if overrides_move and pair is not None:
                if key == "--override-tensor":
                    ot_values.append(g.values[0])
                else:
                    out.env[pair[0]] = pair[1]
                continue
        elif pair is not None and key is not None and counts[key] == 1:
            out.env[pair[0]] = pair[1]
            continue
        out.rest.extend(g.tokens)
    if ot_values:
        out.env["LLAMA_ARG_OVERRIDE_TENSOR"] = ",".join(ot_values)
    return out


def _ik_bool(env: str, on: Callable[[ArgGroup], bool]) -> Callable[[ArgGroup], tuple[str, str]]:
    return lambda g: (env, "1" if on(g) else "0")


def _ik_value(env: str) -> Callable[[ArgGroup], tuple[str, str]]:
    return lambda g: (env, g.values[0])


_IK_ENV_FORMS: dict[str, Callable[[ArgGroup], tuple[str, str]]] = {
    "--model": _ik_value("LLAMA_ARG_MODEL"),
    "--model-url": _ik_value("LLAMA_ARG_MODEL_URL"),
    "--alias": _ik_value("LLAMA_ARG_MODEL_ALIAS"),
    "--hf-repo": _ik_value("LLAMA_ARG_HF_REPO"),
    "--hf-file": _ik_value("LLAMA_ARG_HF_FILE"),
    "--threads": _ik_value("LLAMA_ARG_THREADS"),
    "--ctx-size": _ik_value("LLAMA_ARG_CTX_SIZE"),
    "--parallel": _ik_value("LLAMA_ARG_N_PARALLEL"),
    "--batch-size": _ik_value("LLAMA_ARG_BATCH"),
    "--ubatch-size": _ik_value("LLAMA_ARG_UBATCH"),
    "--gpu-layers": _ik_value("LLAMA_ARG_N_GPU_LAYERS"),
    "--threads-http": _ik_value("LLAMA_ARG_THREADS_HTTP"),
    "--chat-template": _ik_value("LLAMA_ARG_CHAT_TEMPLATE"),
    "--predict": _ik_value("LLAMA_ARG_N_PREDICT"),
    "--defrag-thold": _ik_value("LLAMA_ARG_DEFRAG_THOLD"),
    "--host": _ik_value("LLAMA_ARG_HOST"),
    "--port": _ik_value("LLAMA_ARG_PORT"),
    "--cache-type-k": _ik_value("LLAMA_ARG_CACHE_TYPE_K"),
    "--cache-type-v": _ik_value("LLAMA_ARG_CACHE_TYPE_V"),
    "--flash-attn": _ik_bool("LLAMA_ARG_FLASH_ATTN", lambda g: g.values[0].lower() in ("auto", "1", "on")),
    "--no-flash-attn": _ik_bool("LLAMA_ARG_FLASH_ATTN", lambda g: False),
    "--mlock": _ik_bool("LLAMA_ARG_MLOCK", lambda g: True),
    "--cont-batching": _ik_bool("LLAMA_ARG_CONT_BATCHING", lambda g: True),
    "--no-cont-batching": _ik_bool("LLAMA_ARG_CONT_BATCHING", lambda g: False),
    "--metrics": _ik_bool("LLAMA_ARG_ENDPOINT_METRICS", lambda g: True),
    "--no-slots": _ik_bool("LLAMA_ARG_ENDPOINT_SLOTS", lambda g: False),
    "--embedding": _ik_bool("LLAMA_ARG_EMBEDDINGS", lambda g: True),
    "--k-cache-hadamard": _ik_bool("LLAMA_ARG_K_CACHE_HADAMARD", lambda g: True),
    "--v-cache-hadamard": _ik_bool("LLAMA_ARG_V_CACHE_HADAMARD", lambda g: True),
}


def split_ik(groups: list[ArgGroup]) -> EnvSplit:
    out = EnvSplit()
    if any(g.spec is not None and g.spec.key == "--draft-params" for g in groups):
        # ik's -draft parse applies the LLAMA_ARG_* variables again (common/speculative.cpp, then
        # gpt_params_parse_from_env): a flag moved there would also set the draft's (-ngl over -ngld)
        out.rest = [t for g in groups for t in g.tokens]
        out.notes.append("every flag stays on the command line: ik applies the LLAMA_ARG_* variables "
                         "again to -draft's arguments, so the environment would change the draft's settings")
        return out
    forms = [(_IK_ENV_FORMS.get(g.spec.key) if g.spec is not None else None) for g in groups]
    env_counts = Counter(form(g)[0] for g, form in zip(groups, forms, strict=True) if form is not None)
    for g, form in zip(groups, forms, strict=True):
        if form is not None and g.spec is not None and len(g.values) == g.spec.arity:
            var, value = form(g)
            if env_counts[var] == 1 and _one_line(g.values):
                out.env[var] = value
                continue
        out.rest.extend(g.tokens)
    return out


def args_to_env(args: Sequence[str], dialect: Dialect = Dialect.LLAMA_CPP) -> EnvSplit:
    """Split arguments (no program name) into ``LLAMA_ARG_*`` variables and what stays on argv."""
    groups = group_args(args, dialect)
    return dialect.split_env(groups)
