"""Which device and buffer type every tensor lands on, by llama.cpp's rules, with the rule named.

Follows ``llama_model_base::load_tensors`` and ``llama_model_loader::create_tensor`` of the pinned
llama.cpp build: the input layer on the CPU; ``-ngl`` counts units 0..L (L = block_count, NextN
included; unit L is the output layer) from the top; units split over GPUs by cumulative
``-ts`` fractions; ``-ot`` patterns tried in order with ECMAScript ``regex_search`` (first match
wins); CPU-side weights take the first buffer type of the CPU list that supports their op
(device host buffer, CPU_REPACK, CPU), and with mmap a host-buffer pick becomes ``CPU_Mapped``;
with mmap a Metal GPU's weights are ``MTL<i>_Mapped`` (its backend wraps the mapped file: :func:`gpu_buft`).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from offload_planner.core.devices import Device, DeviceSet
from offload_planner.core.errors import RuleError
from offload_planner.core.model import Model, Tensor
from offload_planner.core.roles import ROUTED_EXPERT_ROLES, Role
from offload_planner.core.rule_match import name_index, rule_set

CPU = "CPU"
CPU_MAPPED = "CPU_Mapped"
CPU_REPACK = "CPU_REPACK"
COPY_SUFFIX = " (output copy)"  # name of the tied-embedding output copy in tensor_devices()

#: ggml types the CPU backend repacks (``ggml_repack_get_optimal_repack_type``) per CPU profile;
#: all need ne[1] % 8 == 0 on x86.
REPACK_TYPES: dict[str, frozenset[str]] = {
    "x86-avx2": frozenset({"q4_0", "q4_K", "iq4_nl", "mxfp4"}),
    "x86-avx512": frozenset({"q4_0", "q4_K", "iq4_nl", "mxfp4", "q2_K"}),
    "arm-i8mm": frozenset({"q4_0", "q4_K", "q5_K", "q6_K", "iq4_nl", "mxfp4", "q8_0"}),
    "none": frozenset(),
}


@dataclass(frozen=True)
class Override:
    pattern: str
    buft: str  # a device name (CPU, CUDA0, RPC0, ...)
    source: str = "-ot"  # which flag or edit produced it


@dataclass(frozen=True)
class PlacementOptions:
    """The inputs of placement, already resolved from the command line and the dialect."""

    n_gpu_layers: int  # resolved count of units to offload (0..L+1); see resolve_ngl
    tensor_split: tuple[float, ...] = ()  # empty: by free memory, as llama.cpp
    split_mode: str = "layer"  # none | layer | row | tensor
    main_gpu: int = 0
    overrides: tuple[Override, ...] = ()
    use_mmap: bool = True
    no_host: bool = False
    use_extra_bufts: bool = True  # CPU_REPACK allowed (-nr disables)
    output_first: bool = True  # pinned mainline offloads the output layer first
    cpu_profile: str = "x86-avx2"
    load_mtp: bool = False
    plain_cpu_overrides: bool = False  # -ot ...=CPU takes the plain CPU buffer type (Dialect)
    #: the GPUs ``-dev`` selects, in its order (None: every GPU; ``()``: ``-dev none``): llama.cpp's
    #: ``model->devices``, the only ones that take layers, ``-ts`` shares and the host buffer type
    selected: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Placed:
    """One tensor allocation. ``device`` is None for tensors llama.cpp skips (NextN without MTP)."""

    tensor: Tensor
    device: str | None
    buft: str | None  # buffer type name as llama.cpp logs it
    rule: str
    copy: bool = False  # the output-layer copy of tied token embeddings

    @property
    def name(self) -> str:
        return self.tensor.name + (COPY_SUFFIX if self.copy else "")

    @classmethod
    def make(cls, tensor: Tensor, device: str | None, buft: str | None, rule: str,
             copy: bool = False) -> Placed:
        """``Placed(...)`` at a third of the cost (a frozen dataclass's ``__init__`` sets each field
        through ``object.__setattr__``; a big model places ~1,000 tensors a plan)."""
        p = _new(cls)
        d = p.__dict__
        d["tensor"], d["device"], d["buft"], d["rule"], d["copy"] = tensor, device, buft, rule, copy
        return p


_new = object.__new__


@dataclass
class Placement:
    items: list[Placed]
    unit_devices: list[str]  # device of each unit 0..L (L = output layer)
    n_layer: int
    warnings: list[str] = field(default_factory=list)
    override_hits: dict[int, int] = field(default_factory=dict)  # override index -> tensors
    model_devices: list[str] = field(default_factory=list)  # llama.cpp's device list (-sm none: one)
    has_overrides: bool = False  # the command carries tensor overrides (turns off pipeline parallelism)
    rule_errors: list[str] = field(default_factory=list)  # -ot rules the planner could not evaluate

    def raise_rule_errors(self) -> None:
        """A :class:`RuleError` for the first -ot rule the planner could not evaluate (it matched
        nothing in this placement), if any."""
        if self.rule_errors:
            raise RuleError(self.rule_errors[0])

    def device_of(self, name: str) -> str | None:
        for p in self.items:
            if p.tensor.name == name and not p.copy:
                return p.device
        raise KeyError(name)

    def tensor_devices(self) -> dict[str, str]:
        return {p.tensor.name + COPY_SUFFIX if p.copy else p.tensor.name: p.device
                for p in self.items if p.device is not None}

    @property
    def output_device(self) -> str:
        return self.unit_devices[self.n_layer]

    def layer_device(self, il: int) -> str:
        return self.unit_devices[il]


def resolve_ngl(ngl: int | None, n_layer: int, *, has_gpu: bool, default_all: bool = True) -> int:
    """-ngl as llama.cpp resolves it: negative (auto/all) or absent means all units (L+1).

    Without a GPU nothing is offloaded whatever the count (``unit_devices`` puts every unit on the
    CPU), so the count is kept: adding a GPU to the plan later offloads what the command says."""
    if ngl is None or ngl < 0:
        return n_layer + 1 if default_all else 0
    return ngl


def unit_devices(n_layer: int, ngl: int, gpus: Sequence[Device], split: Sequence[float],
                 *, output_first: bool) -> list[str]:
    """Device of each unit 0..L: llama.cpp's ``get_layer_buft_list``."""
    if not gpus:
        return [CPU] * (n_layer + 1)
    weights = list(split[: len(gpus)]) + [0.0] * max(0, len(gpus) - len(split))
    if not any(weights) or not all(math.isfinite(w) and w >= 0 for w in weights):
        # all zero: llama.cpp's default split by free memory. NaN, inf or negative proportions
        # fail the load or misplace layers in llama.cpp (refused by cmdline.check_semantics);
        # a projection that is shown anyway (the window) uses the default rather than crash.
        weights = [float(g.capacity or 1) for g in gpus]
    cum: list[float] = []
    total = 0.0
    for w in weights:
        total += w
        cum.append(total)
    cum = [c / total for c in cum]
    start = max(n_layer + 1 - ngl, 0) if output_first else max(n_layer - ngl, 0)
    act = min(ngl, n_layer + 1)
    out = []
    for u in range(n_layer + 1):
        if u < start or (u - start) >= act:
            out.append(CPU)
        else:
            out.append(gpus[bisect.bisect_right(cum, (u - start) / act)].name)
    return out


def compile_override(pattern: str) -> re.Pattern[str]:
    """An -ot pattern as std::regex (ECMAScript, libstdc++) reads it, for regex_search; a pattern
    llama.cpp would refuse matches nothing here (the refusal is reported by the arg checks).
    Matching rules against a model's tensors goes through :func:`rule_set` (cached, budgeted)."""
    from offload_planner.core.cmdline.ecma_regex import EcmaRegexError, compile_pattern

    try:
        return compile_pattern(pattern)
    except (EcmaRegexError, re.error):
        return re.compile(r"(?!)")


_NORMS = frozenset(r for r in Role if r.is_norm)  # Role.is_norm as a set (a property call a tensor)


def _is_weight_matrix(t: Tensor) -> bool:
    return t.name.endswith(".weight") and len(t.shape) >= 2 and t.role not in _NORMS


#: weights the loader creates 3-D from their 2-D file shape: DeepSeek V4's grouped output projection
#: ``wo_a`` {n_head * head / o_groups, o_lora_rank, o_groups} (src/models/deepseek4.cpp, dflash.cpp)
RESHAPED_3D = (".attn_output_a.weight",)


def _repackable(t: Tensor, opts: PlacementOptions, *, as_output: bool = False) -> bool:
    """Would CPU_REPACK take this weight (MUL_MAT on 2-D, MUL_MAT_ID on 3-D experts)?"""
    if not opts.use_extra_bufts or t.type.name not in REPACK_TYPES.get(opts.cpu_profile, frozenset()):
        return False
    if t.role is Role.TOKEN_EMBD and not as_output:
        return False  # GET_ROWS
    if not _is_weight_matrix(t):
        return False
    if t.name.endswith(RESHAPED_3D):
        return False  # created 3-D from a 2-D file tensor (TENSOR_ALLOW_RESHAPE): a 3-D MUL_MAT, not repacked
    dims = len([d for d in t.shape])
    want = 3 if t.role in ROUTED_EXPERT_ROLES or "_exps." in t.name else 2  # NextN blocks' experts too
    return dims == want and t.shape[1] % 8 == 0


def _cpu_buft(t: Tensor, devices: DeviceSet, opts: PlacementOptions, *, as_output: bool = False) -> str:
    """First buffer type of llama.cpp's CPU list that takes this weight."""
    hosts = [g.host_buffer_name for g in selected_gpus(devices, opts) if g.host_buffer_name]
    host = None if opts.no_host or not hosts else hosts[0]
    if host is not None:
        return CPU_MAPPED if opts.use_mmap else host
    if _repackable(t, opts, as_output=as_output):
        return CPU_REPACK
    return CPU_MAPPED if opts.use_mmap else CPU


def gpu_buft(dev: str, devices: DeviceSet, opts: PlacementOptions) -> str:
    """Buffer type of a GPU's weights: the device's own, or with mmap the buffer its backend wraps the
    mapped file in where it can (``buffer_from_host_ptr``: Metal's ``MTL0_Mapped``, sized by the file span
    like ``CPU_Mapped``: :data:`~offload_planner.core.devices.MAPS_HOST_MEMORY`)."""
    if not opts.use_mmap:
        return dev
    d = next((g for g in devices.gpus if g.name == dev), None)
    return (d.mapped_buffer_name if d is not None else None) or dev


def device_buft(dev: str, t: Tensor, devices: DeviceSet, opts: PlacementOptions, *,
                as_output: bool = False, cpu_override: bool = False) -> str:
    """Buffer type a weight gets on ``dev``: the device's own (:func:`gpu_buft`), or the CPU list's pick;
    ``cpu_override``: an ``-ot ...=CPU`` entry, which builds with ``plain_cpu_overrides`` give the plain
    CPU buffer type (mapped with mmap)."""
    if dev != CPU:
        return gpu_buft(dev, devices, opts)
    if cpu_override and opts.plain_cpu_overrides:
        return CPU_MAPPED if opts.use_mmap else CPU
    return _cpu_buft(t, devices, opts, as_output=as_output)


#: per model (its tensor list, held so its id stays unique): the items of its last placements by tensor
#: index, device, buffer type and rule, so that a placement repeating an item hands out the same
#: (frozen) object; the weight buffers and the incremental replay find what changed by identity (the
#: --fit search places the model ~25 times, each close to the one before)
_ItemKey = tuple[int, str | None, str | None, str]
_ITEMS: OrderedDict[int, tuple[list[Tensor], dict[_ItemKey, Placed]]] = OrderedDict()
_ITEMS_MAX = 50_000


def _item_memo(tensors: list[Tensor]) -> dict[_ItemKey, Placed]:
    e = _ITEMS.get(id(tensors))
    if e is None or e[0] is not tensors or len(e[1]) > _ITEMS_MAX:
        e = _ITEMS[id(tensors)] = (tensors, {})
        if len(_ITEMS) > 4:
            _ITEMS.popitem(last=False)
    _ITEMS.move_to_end(id(tensors))
    return e[1]


def selected_gpus(devices: DeviceSet, opts: PlacementOptions) -> list[Device]:
    """The GPUs of llama.cpp's ``model->devices`` before ``-sm none`` keeps one: the ``-dev`` selection
    in its order, or every GPU; the CPU list's host buffer type is the first of them that has one
    (``make_cpu_buft_list``)."""
    if opts.selected is None:
        return list(devices.gpus)
    return [g for g in map(devices.by_name, opts.selected) if g is not None]


def _gpus(devices: DeviceSet, opts: PlacementOptions) -> list[Device]:
    """The GPUs that take layers (-dev: the selected ones; -sm none: the main GPU of those only)."""
    gpus = selected_gpus(devices, opts)
    if opts.split_mode == "none" and gpus:
        gpus = [gpus[opts.main_gpu]] if 0 <= opts.main_gpu < len(gpus) else []
    return gpus


def _home(t: Tensor, units: Sequence[str], n_layer: int) -> str:
    """The device -ngl and -ts give a tensor: the input layer on the CPU, rope factors with layer 0,
    a block past the layer count and the output layer with unit L."""
    if t.layer is None:
        return CPU if t.role is Role.TOKEN_EMBD else units[0] if t.role is Role.ROPE else units[n_layer]
    return units[min(t.layer, n_layer)]


def _home_rule(t: Tensor, n_layer: int, ngl: int) -> str:
    """Why :func:`_home` puts the tensor there."""
    if t.layer is None:
        if t.role is Role.TOKEN_EMBD:
            return "input layer: always on the CPU"
        if t.role is Role.ROPE:
            return "rope factors follow layer 0"
        return f"output layer: unit {n_layer} of -ngl"
    if t.layer >= n_layer:
        return "block past the layer count goes with the output"
    return f"layer {t.layer} by -ngl {ngl}"


_NEXTN_RULE = "NextN/MTP block: not loaded without MTP (unused tensor)"


def place(model: Model, devices: DeviceSet, opts: PlacementOptions) -> Placement:
    s = model.summary
    n_layer = s.n_layer
    gpus = _gpus(devices, opts)
    units = unit_devices(n_layer, opts.n_gpu_layers, gpus, opts.tensor_split, output_first=opts.output_first)
    overrides = opts.overrides
    rules = rule_set(overrides)
    hits: dict[int, int] = {i: 0 for i in range(len(overrides))}
    tensors = model.tensors
    firsts: list[int | None] | None = [None] * len(tensors)  # no rule: none places a tensor
    if overrides:
        firsts = rules.first_of_all(name_index(tensors, lambda: [t.name for t in tensors]))
    one = _PlaceOne(devices, opts, memo=_item_memo(tensors), home=_HomeOf(units, n_layer, opts.n_gpu_layers))
    if firsts is not None and one.cpu_buft.host is not None:
        items = one.by_layer(tensors, firsts, hits)
    else:
        items = []
        for k, t in enumerate(tensors):
            i = firsts[k] if firsts is not None else rules.first(t.name)
            if i is not None:
                hits[i] += 1
            items.append(one(k, t, i))
    if (embd := _tied_embedding(model)) is not None:
        orig = next(p for p in items if p.tensor is embd)
        copy = _tied_copy(embd, orig.device, orig.buft, units[n_layer], devices, opts)
        if copy is not None:
            items.append(copy)
    return Placement(items, units, n_layer, override_hits=hits, model_devices=[g.name for g in gpus],
                     has_overrides=bool(overrides), rule_errors=rules.errors)


class _PlaceOne:
    """The item of one tensor (index ``k``, first matching override ``i``), and of a layer's tensors at
    once (:meth:`by_layer`)."""

    def __init__(self, devices: DeviceSet, opts: PlacementOptions, *, memo: dict[_ItemKey, Placed],
                 home: _HomeOf) -> None:
        self.devices, self.opts, self.memo, self.home = devices, opts, memo, home
        self.cpu_buft = _CpuBuft(devices, opts)
        self.gpu_buft = {g.name: gpu_buft(g.name, devices, opts) for g in devices.gpus}
        self.by_rule: dict[int, tuple[str | None, bool, str]] = {}  # override -> (device, names CPU, rule)
        self.skip_nextn = not opts.load_mtp

    def rule_of(self, i: int) -> tuple[str | None, bool, str]:
        to = self.by_rule.get(i)
        if to is None:
            o = self.opts.overrides[i]
            to = self.by_rule[i] = (self.devices.resolve_buffer_type(o.buft), o.buft.upper() == CPU.upper(),
                                    f"{o.source} {o.pattern}={o.buft}")
        return to

    def __call__(self, k: int, t: Tensor, i: int | None) -> Placed:
        if t.role is Role.NEXTN and self.skip_nextn:
            key: _ItemKey = (k, None, None, "")
            item = self.memo.get(key)
            if item is None:
                item = self.memo[key] = Placed.make(t, None, None, _NEXTN_RULE)
            return item
        dev, buft, rule = self.target(t, i)
        key = (k, dev, buft, rule)
        item = self.memo.get(key)
        if item is None:
            item = self.memo[key] = Placed.make(t, dev, buft, rule)
        return item

    def target(self, t: Tensor, i: int | None) -> tuple[str, str, str]:
        """Device, buffer type and rule of tensor ``t`` (not a skipped NextN one) whose first matching
        override is ``i``."""
        if i is None:
            dev, rule = self.home.by_layer.get(t.layer) or self.home(t)  # its layer's answer looked up here
            buft = self.gpu_buft.get(dev, dev) if dev != CPU else self.cpu_buft(t)
        else:
            to = self.rule_of(i)
            dev, rule = to[0] or self.home(t)[0], to[2]
            if dev != CPU:
                buft = self.gpu_buft.get(dev, dev)
            elif to[1] and self.opts.plain_cpu_overrides:  # device_buft(..., cpu_override=True)
                buft = CPU_MAPPED if self.opts.use_mmap else CPU
            else:
                buft = self.cpu_buft(t)
        return dev, buft, rule

    def by_layer(self, tensors: list[Tensor], firsts: list[int | None], hits: dict[int, int]) -> list[Placed]:
        """Every tensor's item, a layer's run of tensors at once where the same run had the same home
        and the same overrides (by what they resolve to) in an earlier placement of the model (the CPU
        buffer type the same for every tensor: a GPU's host buffer)."""
        items: list[Placed] = []
        runs_memo = _runs_memo(self.memo)
        ctx = (self.cpu_buft.host, self.opts.use_mmap, self.opts.plain_cpu_overrides, self.skip_nextn)
        for k0, k1 in _layer_runs(tensors):
            fs = firsts[k0:k1]
            if k1 - k0 == 1:
                i = fs[0]
                if i is not None:
                    hits[i] += 1
                items.append(self(k0, tensors[k0], i))
                continue
            to_of: dict[int | None, object] = {}
            for i in set(fs):
                if i is not None:
                    to_of[i] = self.rule_of(i)
                    hits[i] += fs.count(i)
            key = (k0, ctx, self.home(tensors[k0]), tuple(map(to_of.get, fs)))
            got = runs_memo.get(key)
            if got is None:
                got = runs_memo[key] = self._run_items(tensors, k0, fs)
            items.extend(got)
        return items

    def _run_items(self, tensors: list[Tensor], k0: int, fs: list[int | None]) -> list[Placed]:
        """The items of a layer's run of tensors from ``k0`` (their first overrides ``fs``): what
        :meth:`__call__` gives each, its target worked out once per override (a run is one layer, no
        NextN tensor, and the CPU buffer type is the same for every tensor here: :meth:`by_layer`)."""
        memo, make, get = self.memo, Placed.make, self.memo.get
        targets: dict[int | None, tuple[str, str, str]] = {}
        for k, i in enumerate(fs, k0):
            if i not in targets:
                targets[i] = self.target(tensors[k], i)
        out: list[Placed] = []
        for k, i in enumerate(fs, k0):
            dev, buft, rule = targets[i]
            key = (k, dev, buft, rule)
            item = get(key)
            if item is None:
                item = memo[key] = make(tensors[k], dev, buft, rule)
            out.append(item)
        return out


#: per item memo (:func:`_item_memo`, held so its id stays unique): the items of its model's runs of a
#: layer's tensors by run, context, home and resolved overrides (:meth:`_PlaceOne.by_layer`)
_RUN_ITEMS: dict[int, tuple[dict[_ItemKey, Placed], dict[tuple[object, ...], list[Placed]]]] = {}
_RUN_ITEMS_MAX = 20_000


def _runs_memo(memo: dict[_ItemKey, Placed]) -> dict[tuple[object, ...], list[Placed]]:
    e = _RUN_ITEMS.get(id(memo))
    if e is None or e[0] is not memo or len(e[1]) > _RUN_ITEMS_MAX:
        e = _RUN_ITEMS[id(memo)] = (memo, {})
        if len(_RUN_ITEMS) > 4:
            _RUN_ITEMS.pop(next(iter(_RUN_ITEMS)))
    return e[1]


def _layer_runs(tensors: list[Tensor]) -> list[tuple[int, int]]:
    """The tensors in runs: consecutive ones of one layer (not NextN), the others one by one."""
    got = _RUNS_OF.get(id(tensors))
    if got is not None and got[0] is tensors:
        return got[1]
    runs: list[tuple[int, int]] = []
    k, n, nextn = 0, len(tensors), Role.NEXTN  # looked up once, not per tensor
    while k < n:
        t = tensors[k]
        il = t.layer
        e = k + 1
        if il is not None and t.role is not nextn:
            while e < n and (u := tensors[e]).layer == il and u.role is not nextn:
                e += 1
        runs.append((k, e))
        k = e
    _RUNS_OF[id(tensors)] = (tensors, runs)
    if len(_RUNS_OF) > 4:
        _RUNS_OF.pop(next(iter(_RUNS_OF)))
    return runs


_RUNS_OF: dict[int, tuple[list[Tensor], list[tuple[int, int]]]] = {}


class _HomeOf:
    """:func:`_home` and :func:`_home_rule` of a tensor, worked out once per layer (a layer's tensors
    share both)."""

    def __init__(self, units: Sequence[str], n_layer: int, ngl: int) -> None:
        self.units, self.n_layer, self.ngl = units, n_layer, ngl
        self.by_layer: dict[int | None, tuple[str, str]] = {}  # None: never (not one layer)

    def __call__(self, t: Tensor) -> tuple[str, str]:
        il = t.layer
        if il is None:
            return _home(t, self.units, self.n_layer), _home_rule(t, self.n_layer, self.ngl)
        got = self.by_layer.get(il)
        if got is None:
            got = self.by_layer[il] = (_home(t, self.units, self.n_layer),
                                       _home_rule(t, self.n_layer, self.ngl))
        return got


class _CpuBuft:
    """:func:`_cpu_buft` with the device set's host buffer worked out once."""

    def __init__(self, devices: DeviceSet, opts: PlacementOptions) -> None:
        hosts = [g.host_buffer_name for g in selected_gpus(devices, opts) if g.host_buffer_name]
        self.host = None if opts.no_host or not hosts else hosts[0]
        self.devices, self.opts = devices, opts

    def __call__(self, t: Tensor) -> str:
        if self.host is not None:
            return CPU_MAPPED if self.opts.use_mmap else self.host
        return _cpu_buft(t, self.devices, self.opts)


def _tied_embedding(model: Model) -> Tensor | None:
    """The token embedding of a model without an output matrix (llama.cpp loads it again for the
    output layer)."""
    return model.get("token_embd.weight") if model.get("output.weight") is None else None


def _tied_copy(embd: Tensor, orig_dev: str | None, orig_buft: str | None, out_dev: str, devices: DeviceSet,
               opts: PlacementOptions) -> Placed | None:
    """The output copy of a tied embedding, None where it shares the original's buffer (llama.cpp
    reuses it)."""
    rules = rule_set(opts.overrides)
    copy_buft = device_buft(out_dev, embd, devices, opts, as_output=True)
    rule = "tied embeddings: token_embd loaded again for the output layer"
    if (i := rules.first(embd.name)) is not None:
        o = opts.overrides[i]
        out_dev = devices.resolve_buffer_type(o.buft) or out_dev
        copy_buft = device_buft(out_dev, embd, devices, opts, as_output=True,
                                cpu_override=o.buft.upper() == CPU.upper())
        rule += f" ({o.source} {o.pattern}={o.buft})"
    if (orig_dev, orig_buft) == (out_dev, copy_buft):
        return None
    return Placed(embd, out_dev, copy_buft, rule, copy=True)


def placed_devices(model: Model, devices: DeviceSet, opts: PlacementOptions) -> dict[str, str]:
    """``place(model, devices, opts).tensor_devices()`` without building the placement (no rule
    texts, a buffer type only for a tied embedding): what the export's checks compare."""
    n_layer = model.summary.n_layer
    units = unit_devices(n_layer, opts.n_gpu_layers, _gpus(devices, opts), opts.tensor_split,
                         output_first=opts.output_first)
    overrides, resolve, tensors = opts.overrides, devices.resolve_buffer_type, model.tensors
    rules = rule_set(overrides)
    firsts: list[int | None] | None = [None] * len(tensors)
    if overrides:
        firsts = rules.first_of_all(name_index(tensors, lambda: [t.name for t in tensors]))
    out: dict[str, str] = {}
    to: dict[int, str | None] = {}  # override -> the device it names
    skip_nextn, nextn = not opts.load_mtp, Role.NEXTN
    for k, t in enumerate(tensors):
        if t.role is nextn and skip_nextn:
            continue
        il = t.layer
        dev = units[il] if il is not None and il <= n_layer else _home(t, units, n_layer)
        if (i := firsts[k] if firsts is not None else rules.first(t.name)) is not None:
            if i not in to:
                to[i] = resolve(overrides[i].buft)
            dev = to[i] or dev
        out[t.name] = dev
    if (embd := _tied_embedding(model)) is not None and embd.name in out:
        dev = out[embd.name]
        i = rules.first(embd.name)
        buft = device_buft(dev, embd, devices, opts, cpu_override=i is not None and
                           overrides[i].buft.upper() == CPU.upper())
        copy = _tied_copy(embd, dev, buft, units[n_layer], devices, opts)
        if copy is not None and copy.device is not None:
            out[copy.name] = copy.device
    return out
