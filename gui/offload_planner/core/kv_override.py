"""``--override-kv KEY=TYPE:VALUE``: the metadata llama.cpp loads a model with.

llama-server reads each item with ``string_parse_kv_override`` (pinned ``common/common.cpp``; ik_llama.cpp's
is the same code): the key up to the first ``=`` (under 128 bytes), then ``int:`` (``atol``), ``float:``
(``atof``), ``bool:true|false`` or ``str:`` (under 128 bytes); anything else refuses the command
("Invalid type for KV override").  The pinned build splits the flag's value at commas
(``parse_csv_row``, llama.cpp PR 18056, December 2025); older mainline builds and ik_llama.cpp take
one item a flag (``Dialect.kv_override_csv``).  Every occurrence adds its items; the loader keeps the
first override of a key (``llama_model_loader``: ``std::map::insert``).

The loader applies an override where it reads the key with ``get_key`` (``GKV::set``: the override wins
when its type is the one the key is read as, else "Bad metadata override type" is logged and the
file's value stays).  The planner applies the overrides whose effect it models, on the keys
``load_hparams`` reads that way for every architecture:

- ``<arch>.expert_used_count`` (``get_key_or_arr``: only where the file holds it as one number; an
  array or a missing key ignores the override): the experts each token runs, so the compute graphs,
  the bytes a token reads and the prompt's FLOPs;
- ``<arch>.context_length`` (``get_key``): the trained context, which ``-c 0`` takes.

Both are ``uint32_t`` fields: an ``int:`` value is stored modulo 2^32, as C++ converts it.  Of the
other keys the planner reads (shapes, counts), an override is noted and not modelled.
"""

from __future__ import annotations

import itertools
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, replace

from offload_planner.core.errors import GGUFError
from offload_planner.core.model import Model

FLAGS = ("--override-kv", "-okv")  # -okv: ik_llama.cpp only (its parser knows no other spelling)
KEY_MAX = 127  # char key[128] with its terminating NUL
STR_MAX = 127  # char val_str[128]
#: the keys whose override the projection follows (``<arch>.`` + these), and what they are
MODELLED = {"expert_used_count": "experts a token uses", "context_length": "trained context"}
#: the other keys the planner reads: an override of one is not modelled (the file's value is used)
READ_ONLY = ("block_count", "nextn_predict_layers", "embedding_length", "attention.head_count",
             "attention.head_count_kv", "attention.key_length", "attention.value_length", "vocab_size",
             "feed_forward_length", "expert_count", "expert_shared_count", "expert_feed_forward_length",
             "leading_dense_block_count", "attention.sliding_window", "attention.q_lora_rank",
             "attention.kv_lora_rank", "attention.key_length_mla", "attention.value_length_mla",
             "attention.key_length_swa", "attention.value_length_swa", "rope.dimension_count",
             "expert_weights_scale", "expert_weights_norm", "expert_gating_func", "expert_group_count",
             "expert_group_used_count")

Value = int | float | bool | str


@dataclass(frozen=True)
class KvOverride:
    key: str
    tag: str  # "int", "float", "bool" or "str"
    value: Value
    item: str  # as given

    def __str__(self) -> str:
        return self.item


_KEYLESS = KvOverride("", "str", "", "")  # an item llama-server refuses: no key of its own


def csv_items(text: str) -> list[str]:
    """``parse_csv_row`` (pinned ``common/arg.cpp``): commas split, a field starting with ``"`` is quoted
    (``""`` inside is one quote); a quote elsewhere is literal."""
    fields: list[str] = []
    field, quoted, i = "", False, 0
    while i < len(text):
        ch = text[i]
        if ch == '"' and not quoted and field:
            field += ch
        elif ch == '"' and not quoted:
            quoted = True
        elif ch == '"' and text[i + 1:i + 2] == '"':
            field, i = field + '"', i + 1
        elif ch == '"':
            quoted = False
        elif ch == "," and not quoted:
            fields.append(field)
            field = ""
        else:
            field += ch
        i += 1
    return [*fields, field]


_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_FLOAT = re.compile(r"[ \t\n\v\f\r]*([+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                    r"|inf(?:inity)?|nan))", re.IGNORECASE)
_I64 = 2**63


def atol(text: str) -> int:
    """glibc ``atol``: leading blanks, a sign, decimal digits; 0 without any; saturated to 64 bits."""
    m = _INT.match(text)
    n = int(m.group(1)) if m else 0
    return max(-_I64, min(_I64 - 1, n))


def atof(text: str) -> float:
    """``atof`` for the decimal forms (and inf/nan): the longest number at the start, else 0."""
    m = _FLOAT.match(text)
    if not m:
        return 0.0
    body = m.group(1)
    try:
        return float(body)
    except ValueError:  # "1e" and the like: the digits before the exponent
        return float(re.match(r"[+-]?[0-9.]*", body).group(0) or 0)  # type: ignore[union-attr]


def parse_item(item: str) -> tuple[KvOverride | None, str]:
    """One override as ``string_parse_kv_override`` reads it, or None and the line it prints."""
    name = "string_parse_kv_override"
    key, sep, rest = item.partition("=")
    if not sep or len(key.encode()) > KEY_MAX:
        return None, f"{name}: malformed KV override '{item}'"
    if rest.startswith("int:"):
        return KvOverride(key, "int", atol(rest[4:]), item), ""
    if rest.startswith("float:"):
        return KvOverride(key, "float", atof(rest[6:]), item), ""
    if rest.startswith("bool:"):
        if rest[5:] not in ("true", "false"):
            return None, f"{name}: invalid boolean value for KV override '{item}'"
        return KvOverride(key, "bool", rest[5:] == "true", item), ""
    if rest.startswith("str:"):
        if len(rest[4:].encode()) > STR_MAX:
            return None, f"{name}: malformed KV override '{item}', value cannot exceed 127 chars"
        return KvOverride(key, "str", rest[4:], item), ""
    return None, f"{name}: invalid type for KV override '{item}'"


def items_of(value: str, csv: bool) -> list[str]:
    """The items one ``--override-kv`` value holds in a build that does (not) split it at commas."""
    return csv_items(value) if csv else [value]


def overrides_in(args: Sequence[str], csv: bool) -> tuple[KvOverride, ...]:
    """Every override the arguments carry (a flag and its value, as kept for the command), in order;
    an item llama-server refuses is left out (the parser reports it)."""
    return tuple(o for flag, value in itertools.pairwise(args) if flag in FLAGS for o in _read(value, csv))


def _read(value: str, csv: bool) -> list[KvOverride]:
    """The overrides of one flag's value that llama-server reads (those it refuses left out)."""
    return [o for o in (parse_item(i)[0] for i in items_of(value, csv)) if o is not None]


def command_overrides(parsed: object, csv: bool) -> tuple[KvOverride, ...]:
    """The overrides a parsed command line carries (its ``--override-kv`` flags, in order; a bare
    ServerArgs has none)."""
    uses = getattr(parsed, "flags", [])
    return tuple(o for use in uses if use.key == FLAGS[0] and use.values for o in _read(use.values[0], csv))


def csv_field(item: str) -> str:
    """An item as ``parse_csv_row`` reads it back: quoted when it holds a comma or a quote."""
    return '"' + item.replace('"', '""') + '"' if ("," in item or '"' in item) else item


def with_override(args: Sequence[str], key: str, item: str | None, csv: bool) -> list[str]:
    """``args`` (a plan's kept flags) with every override of ``key`` taken out of its ``--override-kv``
    flags (a flag left empty goes) and, unless ``item`` is None, ``--override-kv ITEM`` at the end."""
    out: list[str] = []
    i = 0
    while i < len(args):
        flag = args[i]
        if flag in FLAGS and i + 1 < len(args):
            kept = [it for it in items_of(args[i + 1], csv) if (parse_item(it)[0] or _KEYLESS).key != key]
            if kept:
                out += [flag, ",".join(csv_field(it) for it in kept) if csv else kept[0]]
            i += 2
            continue
        out.append(flag)
        i += 1
    return out + (["--override-kv", item] if item is not None else [])


def first_per_key(overrides: Sequence[KvOverride]) -> dict[str, KvOverride]:
    """The override the loader uses for each key: the first (``std::map::insert`` keeps it)."""
    out: dict[str, KvOverride] = {}
    for o in overrides:
        out.setdefault(o.key, o)
    return out


def _applied_value(model: Model, o: KvOverride) -> int | None:
    """The value the loader reads for a modelled key (None: the override does not apply)."""
    held = model.metadata.get(o.key)
    if o.tag != "int" or not isinstance(held, int) or isinstance(held, bool):
        return None  # a type mismatch, a missing key or an array: the file's value (or none)
    return int(o.value) % 2**32


def _modelled(model: Model, overrides: Sequence[KvOverride]) -> dict[str, int]:
    keys = {f"{model.arch}.{k}" for k in MODELLED}
    out: dict[str, int] = {}
    for key, o in first_per_key(overrides).items():
        v = _applied_value(model, o) if key in keys else None
        if v is not None and v != model.metadata.get(key):
            out[key] = v
    return out


_DERIVED: weakref.WeakKeyDictionary[Model, dict[tuple[tuple[str, int], ...], Model]] = (
    weakref.WeakKeyDictionary())
_BASE: weakref.WeakKeyDictionary[Model, Model] = weakref.WeakKeyDictionary()


def file_model(model: Model) -> Model:
    """The model as its file holds it (``model`` itself unless :func:`loaded` made it)."""
    return _BASE.get(model, model) if _BASE else model


def loaded(model: Model, overrides: Sequence[KvOverride]) -> Model:
    """The model llama.cpp loads with these overrides: the file's, with the modelled keys replaced (one
    object per model and values, so the plans of one command share it).  The file's model where nothing
    modelled changes or where the result could not load (:func:`refusal` says why)."""
    base = file_model(model)
    values = _modelled(base, overrides)
    if not values:
        return base
    key = tuple(sorted(values.items()))
    known = _DERIVED.setdefault(base, {})
    if key not in known:
        derived, err = _derived(base, values)
        known[key] = base if err is not None else derived
        _BASE[derived] = base
    return known[key]


def _derived(base: Model, values: dict[str, int]) -> tuple[Model, GGUFError | None]:
    """The file's model with ``values`` in its metadata, and why llama.cpp refuses it (None: it loads)."""
    from offload_planner.core.loadable import load_error

    derived = replace(base, metadata={**base.metadata, **values})
    return derived, load_error(derived)


def overridable_experts(model: Model) -> bool:
    """The file holds ``<arch>.expert_used_count`` as one number: the form an override replaces."""
    held = file_model(model).metadata.get(f"{model.arch}.expert_used_count")
    return isinstance(held, int) and not isinstance(held, bool)


def refusal(model: Model, overrides: Sequence[KvOverride]) -> str:
    """Why llama.cpp refuses the model with these overrides ("" when it loads): its load-time asserts
    (``core.loadable``) on the overridden values."""
    base = file_model(model)
    values = _modelled(base, overrides)
    if not values:
        return ""
    err = _derived(base, values)[1]
    if err is None:
        return ""
    given = ", ".join(first_per_key(overrides)[k].item for k in values)
    return f"--override-kv {given}: {err.detail}"


def notes(model: Model, overrides: Sequence[KvOverride]) -> list[str]:
    """What each override does to the plan: the value the projection now uses, the file's value kept
    (a type the key is not read as), or an override of a key the planner reads but does not model."""
    base = file_model(model)
    arch, out = base.arch, []
    for key, o in first_per_key(overrides).items():
        short = key.removeprefix(f"{arch}.")
        held = base.metadata.get(key)
        if short in MODELLED and key != short:
            out += _modelled_note(base, o, short, held)
        elif short in READ_ONLY and key != short:
            out.append(f"--override-kv {o.item}: not modelled: the projection keeps the file's {key} "
                       f"({held if held is not None else 'absent'})")
    return out


def _modelled_note(base: Model, o: KvOverride, short: str, held: object) -> list[str]:
    what = MODELLED[short]
    if isinstance(held, list):
        return [f"--override-kv {o.item}: ignored: the file holds {o.key} per layer (an array), which "
                "llama.cpp reads without overrides"]
    if held is None:
        return [f"--override-kv {o.item}: ignored: llama.cpp applies it only to a key the file holds "
                f"({o.key} is absent)"] if short == "expert_used_count" else []
    if o.tag != "int":
        return [f"--override-kv {o.item}: llama.cpp logs \"Bad metadata override type for key "
                f"'{o.key}', expected int but got {o.tag}\" and keeps the file's {held}"]
    v = int(o.value) % 2**32
    if v == held:
        return []
    wrapped = f" ({o.value} as uint32_t)" if v != o.value else ""
    tail = ("the projection and the speed estimate use it" if loaded(base, (o,)) is not base
            else "llama.cpp refuses it (below)")
    return [f"--override-kv {o.item}: {what} {v}{wrapped}, the file's {held}: {tail}"]
