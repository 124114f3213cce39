"""``--fit``: the parameters llama-server actually runs with, as ``common_fit_params`` chooses them.

The pinned llama.cpp turns ``--fit`` on by default.  Before loading, ``common_fit_params``
(``common/fit.cpp``) measures dry runs of the model (``no_alloc`` contexts, memory from
``llama_get_memory_breakdown``) and, when a device would keep less free memory than its target
margin (``-fitt``, default 1024 MiB), changes the parameters the user left at their defaults:

1. measure the given parameters (an unset context = the trained length x streams); stop when every
   device keeps its margin;
2. if the devices together are short and the context is unset (``-c`` absent): measure at the
   minimum context (``-fitc``, default 4096; ``-c 0`` pins the full length) and interpolate
   linearly between the two, rounded down to 256 per stream; one device: done;
3. otherwise, only if ``-ngl``, ``-ts`` (several devices), ``-ot``/``--cpu-moe`` are all unset and
   ``-sm`` is not ``row``: fill devices back to front with whole layers (dense) or with layers whose
   routed experts stay in system memory (MoE), each device searched by false position;
4. MoE models whose dense part fits with room to spare: convert those dense-only layers front to
   back into full layers, then try one more partly-overflowing layer (attention + up, + gate, or
   attention only) per device.

This module runs the same search over the planner's projection: per device the weights, KV cache
and the dry-run compute reserve (``compute.simulate(..., no_alloc=True)``, the first prompt-sized
reserve, which is what ``llama_get_memory_breakdown`` reports for a ``no_alloc`` context).  Device
free memory is an input.  Integer arithmetic follows the C++ (int64 truncating division, uint32
wrap of the step sizes), so the result is the same as ``llama-fit-params`` prints
(``tests/integration/test_fit_vs_llama.py``).

The draft/MTP "extra model" the server fits alongside (``-md``, ``--spec-type draft-mtp``) is added
to every measurement as llama.cpp adds it (:mod:`fit_extra`).  Not modelled: ``-sm tensor``
(llama.cpp refuses to fit it; reported as a failure).
Architectures without a graph in :mod:`compute` use its term estimate for the compute buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from offload_planner.core.devices import DeviceSet
from offload_planner.core.fit_extra import ExtraMeasure, ExtraMeasured, extra_measure
from offload_planner.core.memory import Buffer, ContextParams, project, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import (
    CPU,
    CPU_REPACK,
    Override,
    PlacementOptions,
    place,
    resolve_ngl,
    selected_gpus,
)
from offload_planner.core.units import MiB

UINT32_MAX = 0xFFFFFFFF
DEFAULT_MARGIN = 1024 * MiB  # common_params::fit_params_target
DEFAULT_N_CTX_MIN = 4096  # common_params::fit_params_min_ctx
NGL_DEFAULT = -1  # llama_model_default_params().n_gpu_layers

# enum common_layer_fraction_t
LAYER_FRACTION_NONE = 0
LAYER_FRACTION_ATTN = 1
LAYER_FRACTION_UP = 2
LAYER_FRACTION_GATE = 3
LAYER_FRACTION_MOE = 4

PATTERN_MOE_ALL = r"blk\.\d+\.ffn_(up|down|gate_up|gate)_(ch|)exps"

SUCCESS = "success"  # COMMON_PARAMS_FIT_STATUS_SUCCESS
FAILURE = "failure"  # COMMON_PARAMS_FIT_STATUS_FAILURE: gave up (parameters may be partly changed)
ERROR = "error"  # COMMON_PARAMS_FIT_STATUS_ERROR


def overflow_pattern(il: int, lf: int) -> str:
    """``get_overflow_pattern``: the tensors of layer ``il`` that leave the device."""
    if lf == LAYER_FRACTION_ATTN:
        return rf"blk\.{il}\.ffn_(gate|up|gate_up|down).*"
    if lf == LAYER_FRACTION_UP:
        return rf"blk\.{il}\.ffn_(gate|gate_up|down).*"
    if lf == LAYER_FRACTION_GATE:
        return rf"blk\.{il}\.ffn_down.*"
    if lf == LAYER_FRACTION_MOE:
        return rf"blk\.{il}\.ffn_(up|down|gate_up|gate)_(ch|)exps"
    raise ValueError(f"layer fraction {lf}")


class _FitAbort(Exception):
    """``common_params_fit_exception``: fitting stops, the parameters keep what was set so far."""


def _u32(x: int) -> int:
    return x & UINT32_MAX


def _cdiv(a: int, b: int) -> int:
    """C++ integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


@dataclass
class _Ngl:
    """``ngl_t``: layers of one device, ``n_part`` of them with their routed experts elsewhere."""

    n_layer: int = 0
    n_part: int = 0
    overflow_type: int = LAYER_FRACTION_MOE

    def n_full(self) -> int:
        return self.n_layer - self.n_part

    def copy(self) -> _Ngl:
        return _Ngl(self.n_layer, self.n_part, self.overflow_type)


@dataclass(frozen=True)
class Measured:
    """One dry run: per model device (llama.cpp's order) model + context + compute bytes, the
    model bytes alone, and the host side (host buffer types only, as ``common_fit`` sums it)."""

    used: tuple[int, ...]
    model: tuple[int, ...]
    host: int


@dataclass
class FitResult:
    """What ``common_fit_params`` leaves in the model and context parameters.

    ``n_ctx``: the context the server creates (the trained length x streams when ``-c`` is unset);
    ``n_gpu_layers`` -1 = untouched (all layers); ``tensor_split``/``overrides`` None = untouched.
    ``status`` is llama.cpp's (a failure can still have changed the context)."""

    status: str
    n_ctx: int
    n_gpu_layers: int
    tensor_split: tuple[float, ...] | None
    overrides: tuple[Override, ...] | None
    n_ctx_in: int  # the context as given (0 = unset)
    devices: tuple[str, ...]  # the devices fitted (llama.cpp's model devices)
    message: str = ""
    log: list[str] = field(default_factory=list)
    measurements: int = 0
    n_ctx_default: int = 0  # the context without the fit (unset: the trained length x streams)
    n_gpu_layers_in: int = NGL_DEFAULT  # -ngl as given
    #: the draft model's / MTP context's bytes per fitted device that the fit's dry runs added at the
    #: final context (``add_extra_memory``), measured with its own parameters as the command gives
    #: them (for MTP: the main model's placement before the fit changes it); empty without one
    extra_counted: dict[str, int] = field(default_factory=dict)
    #: the margin the fit keeps free on each fitted device (``-fitt``, plus a --mmproj projector's size)
    margins: dict[str, int] = field(default_factory=dict)

    @property
    def ctx_changed(self) -> bool:
        """The context differs from what the command alone gives (an unset context = the trained
        length is not a change)."""
        return self.n_ctx != self.n_ctx_default

    @property
    def layers_changed(self) -> bool:
        """-ngl, -ts or -ot differ from the command's (the fit writes them only when it places
        layers itself, which it does only when the user left all three unset)."""
        return (self.n_gpu_layers != self.n_gpu_layers_in or self.tensor_split is not None
                or bool(self.overrides))

    @property
    def changed(self) -> bool:
        return self.ctx_changed or self.layers_changed

    def cli_args(self, buft_names: dict[str, str] | None = None) -> list[str]:
        """The arguments as ``llama-fit-params`` prints them: ``-c N -ngl M [-ts ...] [-ot "..."]``
        (``-ts`` trimmed of trailing zero entries and left out for one entry)."""
        names = buft_names or {}
        out = ["-c", str(self.n_ctx), "-ngl", str(self.n_gpu_layers)]
        ts = list(self.tensor_split or ())
        while len(ts) > 1 and ts[-1] == 0.0:
            ts.pop()
        if len(ts) > 1:
            out += ["-ts", ",".join(str(int(x)) for x in ts)]
        if self.overrides:
            out += ["-ot", ",".join(f"{o.pattern}={names.get(o.buft, o.buft)}" for o in self.overrides)]
        return out

    def changed_args(self, buft_names: dict[str, str] | None = None) -> list[str]:
        """Only what the fit changed, as llama-server arguments."""
        full = self.cli_args(buft_names)
        out: list[str] = []
        if self.ctx_changed:
            out += full[0:2]
        if self.layers_changed:
            out += full[2:]
        return out

    def apply(self, popts: PlacementOptions, cparams: ContextParams, n_layer: int,
              *, has_gpu: bool) -> tuple[PlacementOptions, ContextParams]:
        """The placement options and context the server runs with after the fit."""
        if self.n_gpu_layers != NGL_DEFAULT:
            popts = replace(popts, n_gpu_layers=resolve_ngl(self.n_gpu_layers, n_layer, has_gpu=has_gpu))
        if self.tensor_split is not None:
            popts = replace(popts, tensor_split=self.tensor_split)
        if self.overrides is not None:
            popts = replace(popts, overrides=self.overrides)
        return popts, replace(cparams, n_ctx=self.n_ctx)


def device_memory(model: Model, devices: DeviceSet, popts: PlacementOptions,
                  cparams: ContextParams) -> Measured:
    """``common_get_device_memory_data`` for these parameters: the dry run's breakdown per model
    device (weights, KV, ``no_alloc`` compute reserve) and on the host (host buffer types)."""
    from offload_planner.core.compute import SIMULATION_LOCK, backends_for, simulate, term_estimate

    s = model.summary
    popts = replace(popts, use_mmap=False)  # the dry run loads with LLAMA_LOAD_MODE_NONE
    placement = place(model, devices, popts)
    ctx = resolve_context(cparams, s.n_ctx_train, s.n_swa)
    with SIMULATION_LOCK:
        try:
            # replayed against an earlier dry run of the same graph (the search measures ~25)
            sim = simulate(model, devices, placement, ctx, cparams, no_alloc=True, incremental=True)
        except (KeyError, IndexError, ValueError, ZeroDivisionError, AssertionError):
            sim = None
        if sim is not None:
            compute = [Buffer(be.name, be.buft, "compute", size, "dry run")
                       for be, size in zip(sim.backends, sim.sizes, strict=True) if size > 1]
        else:
            est = term_estimate(model, devices, placement, ctx, cparams)
            compute = [Buffer(be.name, be.buft, "compute", est[be.name], "estimate")
                       for be in backends_for(devices, placement) if est.get(be.name, 0) > 1]
    proj = project(model, devices, placement, cparams, compute=compute)
    used: list[int] = []
    weights: list[int] = []
    for name in placement.model_devices:
        dm = proj.device(name)
        used.append(sum(b.bytes for b in dm.buffers if b.kind != "output"))
        weights.append(dm.weights)
    cpu = proj.device(devices.cpu.name)
    host = sum(b.bytes for b in cpu.buffers if b.kind != "output" and b.name != CPU_REPACK)
    return Measured(tuple(used), tuple(weights), host)


def fit_params(model: Model, devices: DeviceSet, popts: PlacementOptions, cparams: ContextParams, *,
               free_bytes: Sequence[int], margins: Sequence[int] | int = DEFAULT_MARGIN,
               n_gpu_layers: int = NGL_DEFAULT, user_tensor_split: Sequence[float] = (),
               user_overrides: Sequence[Override] = (), n_ctx_min: int = DEFAULT_N_CTX_MIN,
               cpu_total: int | None = None, extra: ExtraMeasure | None = None,
               measure: Callable[[PlacementOptions, ContextParams], Measured] | None = None) -> FitResult:
    """``common_fit_params`` on the planner's projection.

    ``popts``/``cparams``: the parameters as the command line gives them (``cparams.n_ctx`` 0 =
    unset); ``n_gpu_layers``, ``user_tensor_split``, ``user_overrides``: what the user set (-1, empty
    = llama.cpp's defaults, which are the only ones the fit changes).  ``free_bytes``: free memory of
    each offload device of ``devices.gpus``; ``margins``: bytes to leave free per device (``-fitt``);
    ``n_ctx_min``: ``-fitc`` (``UINT32_MAX`` when ``-c 0`` asks for the full context).
    ``cpu_total``: system memory for a CPU-only fit (default: the CPU device's total)."""
    meas = measure or (lambda po, cp: device_memory(model, devices, po, cp))
    extra_memo: dict[int, ExtraMeasured] = {}
    if extra is not None:
        meas = _with_extra(meas, extra, place(model, devices, replace(popts, overrides=())).model_devices,
                           extra_memo)
    s = model.summary
    gpu_names = [g.name for g in devices.gpus]
    free_of = dict(zip(gpu_names, free_bytes, strict=False))
    base_popts = replace(popts, n_gpu_layers=resolve_ngl(n_gpu_layers, s.n_layer, has_gpu=bool(gpu_names)),
                         tensor_split=tuple(user_tensor_split), overrides=tuple(user_overrides))
    devs = place(model, devices, replace(base_popts, overrides=())).model_devices if gpu_names else []
    nd = len(devs)
    if isinstance(margins, int):
        margin_list = [margins] * max(nd, 1)
    else:
        margin_list = [*margins, *[DEFAULT_MARGIN] * max(0, max(nd, len(gpu_names), 1) - len(margins))]
        if nd:  # common/fit.cpp: margins[id] = margins_s[id], id the model device's index (-dev's
            # order; -sm none: the main GPU is device 0 and takes -fitt's first value)
            margin_list = margin_list[:nd]
    hp_ngl = s.n_layer_trunk + (s.n_nextn if popts.load_mtp else 0)
    hp_nct = s.n_ctx_train
    hp_nex = s.n_expert
    n_streams = 1 if cparams.kv_unified else max(1, cparams.n_seq_max)
    n_ctx_auto = cparams.n_ctx == 0
    n_ctx_max = min(hp_nct * n_streams, UINT32_MAX)
    n_ctx_min_total = min(n_ctx_min * n_streams, UINT32_MAX)

    st: dict[str, Any] = {
        "n_ctx": n_ctx_max if n_ctx_auto else cparams.n_ctx,
        "ngl": n_gpu_layers, "ts": None, "ot": None, "count": 0,
    }
    log: list[str] = []

    def trc(msg: str) -> None:
        log.append(msg)

    def measure_with(ngl: int, ts: tuple[float, ...], ot: tuple[Override, ...]) -> Measured:
        st["count"] += 1
        po = replace(base_popts, n_gpu_layers=resolve_ngl(ngl, s.n_layer, has_gpu=nd > 0),
                     tensor_split=ts, overrides=ot)
        return meas(po, replace(cparams, n_ctx=st["n_ctx"]))

    def result(status: str, message: str = "") -> FitResult:
        e = extra_memo.get(st["n_ctx"])
        counted = {d: e.used.get(d, 0) for d in devs} if e is not None else {}
        return FitResult(status, st["n_ctx"], st["ngl"], st["ts"], st["ot"], cparams.n_ctx, tuple(devs),
                         message, log, st["count"], n_ctx_max if n_ctx_auto else cparams.n_ctx, n_gpu_layers,
                         counted, dict(zip(devs, margin_list, strict=False)))

    if popts.split_mode == "tensor":
        return result(FAILURE, "llama_params_fit is not implemented for SPLIT_MODE_TENSOR, abort")
    user_ts = tuple(user_tensor_split)
    user_ot = tuple(user_overrides)
    from offload_planner.core.compute.simulate import no_cyclic_gc
    from offload_planner.core.compute.template import coding_first_walks

    try:  # ~25 placements and projections beside the recorded references, on one kept graph
        with no_cyclic_gc(), coding_first_walks():
            _fit_impl(st, trc, measure_with, nd=nd, devs=devs, free_of=free_of, margins=margin_list,
                      hp_ngl=hp_ngl, hp_nex=hp_nex, n_ctx_auto=n_ctx_auto, n_ctx_max=n_ctx_max,
                      n_ctx_min=n_ctx_min, n_ctx_min_total=n_ctx_min_total, n_streams=n_streams,
                      user_ngl=n_gpu_layers, user_ts=user_ts, user_ot=user_ot, split_mode=popts.split_mode,
                      cpu_total=cpu_total if cpu_total is not None else (devices.cpu.total or 0))
    except _FitAbort as e:
        trc(f"failed to fit params to free device memory: {e}")
        return result(FAILURE, str(e))
    except ZeroDivisionError:  # -ngl 0 on several devices: llama.cpp divides by zero (SIGFPE)
        return result(ERROR, "division by zero in the context estimate (-ngl 0 on several devices)")
    trc("successfully fit params to free device memory")
    return result(SUCCESS)


def _with_extra(meas: Callable[[PlacementOptions, ContextParams], Measured], extra: ExtraMeasure,
                devs: list[str], memo: dict[int, ExtraMeasured]
                ) -> Callable[[PlacementOptions, ContextParams], Measured]:
    """``add_extra_memory``: the extra model's dry run (again when the context changes, kept in
    ``memo`` by context) added to each measurement, on the main model's devices (its other devices
    are dropped)."""

    def measure(po: PlacementOptions, cp: ContextParams) -> Measured:
        m = meas(po, cp)
        e = memo.get(cp.n_ctx) or memo.setdefault(cp.n_ctx, extra(cp.n_ctx))
        return Measured(tuple(u + e.used.get(d, 0) for u, d in zip(m.used, devs, strict=False)),
                        tuple(w + e.model.get(d, 0) for w, d in zip(m.model, devs, strict=False)),
                        m.host + e.host)

    return measure


def _fit_impl(st: dict[str, Any], trc: Callable[[str], None],
              measure_with: Callable[[int, tuple[float, ...], tuple[Override, ...]], Measured], *,
              nd: int, devs: list[str], free_of: dict[str, int], margins: list[int], hp_ngl: int,
              hp_nex: int, n_ctx_auto: bool, n_ctx_max: int, n_ctx_min: int, n_ctx_min_total: int,
              n_streams: int, user_ngl: int, user_ts: tuple[float, ...], user_ot: tuple[Override, ...],
              split_mode: str, cpu_total: int) -> None:
    free = [free_of.get(d, 0) for d in devs]

    # step 1: the given parameters
    full = measure_with(user_ngl, user_ts, user_ot)
    sum_free = sum_projected_free = sum_projected_used = sum_projected_model = 0
    projected_free: list[int] = []
    if nd == 0:
        sum_projected_used = full.host
        sum_free = cpu_total
        sum_projected_free = sum_free - sum_projected_used
        trc(f"projected to use {sum_projected_used // MiB} MiB of host memory vs. "
            f"{sum_free // MiB} MiB of total host memory")
        if sum_projected_free >= margins[0]:
            trc(f"will leave {sum_projected_free // MiB} >= {margins[0] // MiB} MiB of system memory, "
                "no changes needed")
            return
    else:
        for i in range(nd):
            used = full.used[i]
            pf = free[i] - used
            projected_free.append(pf)
            sum_free += free[i]
            sum_projected_used += used
            sum_projected_free += pf
            sum_projected_model += full.model[i]
            trc(f"  - {devs[i]}: {used // MiB} used, {pf // MiB} free vs. target of {margins[i] // MiB}")
        trc(f"projected to use {sum_projected_used // MiB} MiB of device memory vs. "
            f"{sum_free // MiB} MiB of free device memory")
        if all(projected_free[i] >= margins[i] for i in range(nd)):
            trc("targets for free memory can be met on all devices, no changes needed")
            return

    # step 2: reduce the context
    global_surplus = sum_projected_free - sum(margins[: max(nd, 1)])
    if global_surplus < 0:
        trc(f"cannot meet free memory targets, need to use {-global_surplus // MiB} MiB less in total")
        if n_ctx_auto:
            if n_ctx_max > n_ctx_min_total:
                sum_used_target = sum_free - sum(margins[: max(nd, 1)])
                if nd > 1:
                    ngl_u32 = _u32(user_ngl)
                    model_per_layer = sum_projected_model // min(ngl_u32, hp_ngl)
                    sum_used_target -= (nd + 1) * model_per_layer // (2 if hp_nex == 0 else 6)
                st["n_ctx"] = n_ctx_min_total
                min_ctx = measure_with(user_ngl, user_ts, user_ot)
                used_min = min_ctx.host if nd == 0 else sum(min_ctx.used[:nd])
                if sum_used_target > used_min:
                    n = st["n_ctx"] + _cdiv((n_ctx_max - n_ctx_min_total) * (sum_used_target - used_min),
                                            sum_projected_used - used_min)
                    n = _u32(n)
                    align = 256 * n_streams
                    st["n_ctx"] = max(n - n % align, n_ctx_min_total)
                    trc(f"context size reduced from {n_ctx_max} to {st['n_ctx']}")
                    if nd <= 1:
                        trc("entire model can be fit by reducing context")
                        return
                    trc("entire model should be fit across devices by reducing context")
                else:
                    trc(f"context size reduced from {n_ctx_max} to {st['n_ctx']}")
            elif n_ctx_min == UINT32_MAX:
                trc(f"user has requested full context size of {n_ctx_max} -> no change")
            else:
                trc(f"default model context size is {n_ctx_max} which is <= the min. context size of "
                    f"{n_ctx_min_total} -> no change")
        else:
            trc(f"context size set by user to {st['n_ctx']} -> no change")
    if nd == 0:
        raise _FitAbort("was unable to fit model into system memory by reducing context, abort")
    if user_ngl != NGL_DEFAULT:
        raise _FitAbort(f"n_gpu_layers already set by user to {user_ngl}, abort")
    if nd > 1:
        if any(x != 0.0 for x in user_ts[:nd]):
            raise _FitAbort("model_params::tensor_split already set by user, abort")
        if split_mode == "row":
            raise _FitAbort("changing weight allocation for LLAMA_SPLIT_MODE_ROW not implemented, abort")
    if user_ot:
        raise _FitAbort("model_params::tensor_buft_overrides already set by user, abort")

    _fit_layers(st, trc, measure_with, nd=nd, devs=devs, free=free, margins=margins, hp_ngl=hp_ngl,
                hp_nex=hp_nex)


def _tbo(ngl_per_device: list[_Ngl], overflow_bufts: list[str], nd: int,
         hp_ngl: int) -> tuple[int, tuple[float, ...], tuple[Override, ...]]:
    """``set_ngl_tensor_split_tbo``: -ngl, -ts and the overflow overrides of a layer assignment."""
    ngl = sum(n.n_layer for n in ngl_per_device)
    ts = tuple(float(n.n_layer) for n in ngl_per_device) if nd > 1 else ()
    il0 = hp_ngl + 1 - ngl
    ot: list[Override] = []
    for i in range(nd):
        il0 += ngl_per_device[i].n_full()
        for il in range(il0, il0 + ngl_per_device[i].n_part):
            first = il == il0
            lf = ngl_per_device[i].overflow_type if first else LAYER_FRACTION_MOE
            ot.append(Override(overflow_pattern(il, lf), overflow_bufts[i] if first else CPU, "--fit"))
        il0 += ngl_per_device[i].n_part
    return ngl, ts, tuple(ot)


def _fit_layers(st: dict[str, Any], trc: Callable[[str], None],
                measure_with: Callable[[int, tuple[float, ...], tuple[Override, ...]], Measured], *,
                nd: int, devs: list[str], free: list[int], margins: list[int], hp_ngl: int,
                hp_nex: int) -> None:
    """Steps 3 and 4: the layer distribution (``common_params_fit_impl`` after the checks)."""
    surplus = 0
    if hp_nex > 0:
        surplus = _cpu_moe_surplus(trc, measure_with, nd, free, margins)
        st["ot"] = ()  # the reset leaves an empty override list
    lf = _LayerFit(trc, measure_with, nd, devs, free, [free[i] - margins[i] for i in range(nd)],
                   hp_ngl, hp_nex)
    lf.fill_dense()
    if hp_nex > 0 and surplus > 0:
        lf.convert_to_full()
    st["ngl"], ts, ot = _tbo(lf.ngl, lf.bufts, nd, hp_ngl)
    st["ts"] = ts if nd > 1 else None
    st["ot"] = ot


def _cpu_moe_surplus(trc: Callable[[str], None],
                     measure_with: Callable[[int, tuple[float, ...], tuple[Override, ...]], Measured],
                     nd: int, free: list[int], margins: list[int]) -> int:
    """The memory left over (negative: missing) with every expert on the CPU."""
    cpu_moe = measure_with(NGL_DEFAULT, (), (Override(PATTERN_MOE_ALL, CPU, "--fit"),))
    surplus = sum(free[i] - (cpu_moe.used[i] + margins[i]) for i in range(nd))
    if surplus > 0:
        trc(f"with only dense weights in device memory there is a total surplus of {surplus // MiB} MiB")
    else:
        trc(f"with only dense weights in device memory there is still a total deficit of "
            f"{-surplus // MiB} MiB")
    return surplus


def _copy(v: list[_Ngl]) -> list[_Ngl]:
    return [n.copy() for n in v]


def _step(delta: int, target: int, lo: int, hi: int) -> int:
    """The interpolated step of llama.cpp's bisection, within [1, delta - 1]."""
    s = _u32(_cdiv(delta * (target - lo), hi - lo))
    return min(max(s, 1), delta - 1)


class _LayerFit:
    """The state of steps 3 and 4: layers per device, the overflow buffer types, the memory used."""

    def __init__(self, trc: Callable[[str], None],
                 measure_with: Callable[[int, tuple[float, ...], tuple[Override, ...]], Measured],
                 nd: int, devs: list[str], free: list[int], targets: list[int], hp_ngl: int,
                 hp_nex: int) -> None:
        self.trc, self.measure_with = trc, measure_with
        self.nd, self.devs, self.free, self.targets = nd, devs, free, targets
        self.hp_ngl, self.hp_nex = hp_ngl, hp_nex
        self.bufts = [CPU] * nd
        self.ngl = [_Ngl() for _ in range(nd)]
        self.mem = self.mem_for(self.ngl, self.bufts)
        self.dense_start = nd

    def mem_for(self, ngl_per_device: list[_Ngl], overflow_bufts: list[str], *,
                step: bool = False) -> list[int]:
        """``step``: a bisection step or a partial layer, which the next dry runs stay near (the dry run
        is recorded as a replay reference at once, not the second time its layout is seen)."""
        from offload_planner.core.compute.incremental import recording_first_sights

        with recording_first_sights(step):
            m = self.measure_with(*_tbo(ngl_per_device, overflow_bufts, self.nd, self.hp_ngl))
        self.trc("memory for test allocation by device: " + ", ".join(
            f"id={i} n_layer={n.n_layer} n_part={n.n_part} overflow_type={n.overflow_type} "
            f"mem={m.used[i] // MiB} MiB" for i, n in enumerate(ngl_per_device)))
        return list(m.used[:self.nd])

    # step 3: fill dense (MoE: dense-only) layers back to front
    def fill_dense(self) -> None:
        nd = self.nd
        for i in range(nd - 1, -1, -1):
            n_unassigned = self.hp_ngl + 1 - sum(self.ngl[j].n_layer for j in range(i + 1, nd))
            high = _copy(self.ngl)
            high[i].n_layer = n_unassigned
            if self.hp_nex > 0:
                high[i].n_part = high[i].n_layer if i < nd - 1 else high[i].n_layer - 1
            if high[i].n_layer > 0:
                mem_high = self.mem_for(high, self.bufts)
                if mem_high[i] > self.targets[i]:
                    self._bisect_dense(i, high, mem_high)
                else:
                    self.ngl, self.mem = high, mem_high
            self.trc(f"  - {self.devs[i]}: {self.ngl[i].n_layer} layers, {self.mem[i] // MiB} MiB used, "
                     f"{(self.free[i] - self.mem[i]) // MiB} MiB free")

    def _bisect_dense(self, i: int, high: list[_Ngl], mem_high: list[int]) -> None:
        delta = high[i].n_layer - self.ngl[i].n_layer
        while delta > 1:
            step_size = _step(delta, self.targets[i], self.mem[i], mem_high[i])
            test = _copy(self.ngl)
            test[i].n_layer += step_size
            if self.hp_nex:
                test[i].n_part += step_size - 1 if i == self.nd - 1 and test[i].n_part == 0 else step_size
            mem_test = self.mem_for(test, self.bufts, step=True)
            if mem_test[i] <= self.targets[i]:
                self.ngl, self.mem = test, mem_test
            else:
                high, mem_high = test, mem_test
            delta = high[i].n_layer - self.ngl[i].n_layer

    # step 4: MoE with room to spare: dense-only layers become full layers, front to back
    def convert_to_full(self) -> None:
        nd = self.nd
        self.dense_start = nd
        for i in range(nd - 1, -1, -1):
            if self.ngl[i].n_layer > 0:
                self.dense_start = i
                continue
            break
        i = 0
        while i <= self.dense_start and self.dense_start < nd:
            self._convert_on(i)
            self._fraction_on(i)
            self.trc(f"  - {self.devs[i]}: {self.ngl[i].n_layer} layers ({self.ngl[i].n_part} overflowing), "
                     f"{self.mem[i] // MiB} MiB used, {(self.free[i] - self.mem[i]) // MiB} MiB free")
            i += 1

    def _convert_on(self, i: int) -> None:
        nd = self.nd
        high = _copy(self.ngl)
        for j in range(self.dense_start, nd):
            n_move = high[j].n_layer if j < nd - 1 else high[j].n_layer - 1
            high[i].n_layer += n_move
            high[j].n_layer -= n_move
            high[j].n_part = 0
        dense_start_high = nd - 1
        mem_high = self.mem_for(high, self.bufts)
        if mem_high[i] <= self.targets[i]:
            self.ngl, self.mem, self.dense_start = high, mem_high, dense_start_high
            return
        delta = high[i].n_full() - self.ngl[i].n_full()
        while delta > 1:
            step_size = _step(delta, self.targets[i], self.mem[i], mem_high[i])
            test, ids_test = self._converted(i, step_size)
            mem_test = self.mem_for(test, self.bufts, step=True)
            if mem_test[i] <= self.targets[i]:
                self.ngl, self.mem, self.dense_start = test, mem_test, ids_test
            else:
                high, mem_high = test, mem_test
            delta = high[i].n_full() - self.ngl[i].n_full()

    def _converted(self, i: int, step_size: int) -> tuple[list[_Ngl], int]:
        """``step_size`` dense-only layers from the devices after ``i`` made full layers on ``i``."""
        test = _copy(self.ngl)
        ids_test = self.dense_start
        n_converted = 0
        while ids_test < self.nd:
            n_convert = min(step_size - n_converted, test[ids_test].n_part)
            test[ids_test].n_layer -= n_convert
            test[ids_test].n_part -= n_convert
            test[i].n_layer += n_convert
            n_converted += n_convert
            if test[ids_test].n_part > 0:
                break
            ids_test += 1
        return test, ids_test

    def _fits(self, m: list[int], i: int) -> bool:
        return m[i] < self.targets[i] and (i + 1 == self.nd or m[i + 1] < self.targets[i + 1])

    def _fraction_on(self, i: int) -> None:
        """Try to fit at least part of one more layer on device ``i``."""
        nd = self.nd
        if not (self.dense_start < nd and self.ngl[self.dense_start].n_layer > (0 if i < nd - 1 else 1)):
            return
        test = _copy(self.ngl)
        ids_test = self.dense_start
        test[ids_test].n_layer -= 1
        test[ids_test].n_part -= 1
        test[i].n_layer += 1
        test[i].n_part += 1
        if test[ids_test].n_part == 0:
            ids_test += 1
        test[i].overflow_type = LAYER_FRACTION_UP
        bufts_test = list(self.bufts)
        if i < nd - 1:
            bufts_test[i] = self.devs[i + 1]
        mem_test = self.mem_for(test, bufts_test, step=True)
        if self._fits(mem_test, i):
            self.ngl, self.bufts, self.mem = _copy(test), bufts_test, mem_test
            self.dense_start = ids_test
            test[i].overflow_type = LAYER_FRACTION_GATE
        else:
            test[i].overflow_type = LAYER_FRACTION_ATTN
        mem_test = self.mem_for(test, bufts_test, step=True)
        if self._fits(mem_test, i):
            self.ngl, self.bufts, self.mem, self.dense_start = test, bufts_test, mem_test, ids_test


# --- from a command line ---------------------------------------------------------------------------


def fit_inputs(args: Any) -> dict[str, Any]:
    """The fit's inputs a llama-server command sets: whether it is on, -fitt margins (bytes),
    -fitc (``-c 0`` = ``UINT32_MAX`` unless a later -fitc), the user's -ngl/-ts/-ot."""
    inner = getattr(args, "args", None)
    sa = inner if inner is not None and hasattr(args, "passthrough") else args
    n_ctx_min = DEFAULT_N_CTX_MIN
    flags = getattr(args, "flags", None)
    if flags:
        for f in flags:
            if f.key == "--ctx-size" and f.values and f.values[0].strip() == "0":
                n_ctx_min = UINT32_MAX
            elif f.key == "--fit-ctx" and f.values:
                n_ctx_min = int(getattr(sa, "fit_ctx", 0) or 0) or n_ctx_min
    else:
        if getattr(sa, "ctx_size", None) == 0:
            n_ctx_min = UINT32_MAX
        if getattr(sa, "fit_ctx", None) is not None:
            n_ctx_min = int(sa.fit_ctx)
    target = getattr(sa, "fit_target", None)
    margins: list[int] | int = DEFAULT_MARGIN
    if target:
        margins = target[0] * MiB if len(target) == 1 else [t * MiB for t in target]
    ngl = getattr(sa, "n_gpu_layers", None)
    return {
        "fit": getattr(sa, "fit", None) is not False,
        "margins": margins,
        "n_ctx_min": n_ctx_min,
        "n_gpu_layers": NGL_DEFAULT if ngl is None else int(ngl),
        "user_tensor_split": tuple(getattr(sa, "tensor_split", None) or ()),
    }


def fit_for_args(model: Model, devices: DeviceSet, args: Any, popts: PlacementOptions,
                 cparams: ContextParams, *, free_bytes: Sequence[int] | None = None) -> FitResult | None:
    """The fit llama-server runs for a parsed command line; None when ``-fit off``.  Free memory
    defaults to each device's known capacity minus the margin the user keeps on it (unknown: 0)."""
    inputs = fit_inputs(args)
    if not inputs.pop("fit"):
        return None
    if free_bytes is None:
        free_bytes = [max(0, (g.capacity or 0) - g.margin) for g in devices.gpus]
    from offload_planner.core.engine import placement_options
    from offload_planner.core.speculative import load_spec

    spec = load_spec(devices, args, cparams.dialect, placement_options)
    extra = extra_measure(model, devices, popts, cparams, spec, device_memory)
    inputs["margins"] = _mmproj_margins(args, devices, inputs["margins"])
    return fit_params(model, devices, popts, cparams, free_bytes=free_bytes,
                      user_overrides=popts.overrides, extra=extra, **inputs)


def _mmproj_margins(args: Any, devices: DeviceSet, margins: list[int] | int) -> list[int] | int:
    """The server adds the --mmproj projector's memory to the fit's targets before fitting."""
    from offload_planner.core.mmproj.attach import fa_setting, fit_margins, mmproj_setup

    sa = getattr(args, "args", args)
    return fit_margins(mmproj_setup(args), devices, fa_setting(getattr(sa, "flash_attn", None)), margins)


def server_fit(model: Model, devices: DeviceSet, args: Any, popts: PlacementOptions,
               cparams: ContextParams) -> FitResult | None:
    """What the pinned llama-server's ``--fit`` (on unless ``-fit off``) does with this command on
    these devices, taking each GPU's known free memory (else its total) as what it finds free;
    None when the fit is off, there is no GPU, or a GPU's memory is unknown (an RPC server not
    declared with ``--device``): what the fit does depends on it."""
    gpus = selected_gpus(devices, popts)  # -dev: the fit sees the model's devices only
    if not gpus or any(g.capacity is None for g in gpus):
        return None
    return fit_for_args(model, devices, args, popts, cparams,
                        free_bytes=[g.capacity or 0 for g in devices.gpus])


def fit_summary(result: FitResult, devices: DeviceSet, command: Sequence[str]) -> dict[str, Any]:
    """``plan --json``'s ``fit`` entry: llama.cpp's status, the arguments the fit changes (as
    llama-fit-params prints them) and the shortest equivalent command."""
    names = devices.buffer_types()
    return {"status": result.status, "changed": result.changed,
            "args": result.changed_args(names) if result.changed else [],
            "command": list(command) if result.changed else [], "message": result.message}


def fitted_command(result: FitResult, model: Model, devices: DeviceSet, popts: PlacementOptions,
                   cparams: ContextParams) -> list[str]:
    """The shortest command (range regexes, -fit off) that places tensors as the fitted server does."""
    from offload_planner.core.plan import Plan, plan_command

    f_popts, f_ctx = result.apply(popts, cparams, model.summary.n_layer, has_gpu=bool(devices.gpus))
    return plan_command(Plan(model, devices, f_popts, f_ctx))


def fit_note(result: FitResult, command: Sequence[str]) -> str | None:
    """One line for a plan: what --fit changes, or None when it keeps the command as written."""
    if not result.changed:
        return None
    from offload_planner.core.cmdline import format_command

    failed = "" if result.status == "success" else f" (llama.cpp reports: {result.status})"
    return (f"--fit is on (this build's default) and changes this command{failed}: llama-server will run "
            f"the equivalent of: {format_command(['llama-server', *command], 'bash')}. The table shows "
            "the command as written; add -fit off to keep it")


__all__ = [
    "FitResult",
    "Measured",
    "device_memory",
    "fit_for_args",
    "fit_inputs",
    "fit_note",
    "fit_params",
    "fit_summary",
    "fitted_command",
    "overflow_pattern",
    "server_fit",
]
