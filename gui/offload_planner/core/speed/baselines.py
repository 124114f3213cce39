"""The baselines the fastest-plan search beats or matches: the best ``--n-cpu-moe N`` and
llama.cpp's own ``--fit`` (``--cpu-moe`` is a plain candidate)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from offload_planner.core.memory import alloc_size, pad
from offload_planner.core.placement import CPU
from offload_planner.core.plan import Plan
from offload_planner.core.speed.candidate import Candidate, room
from offload_planner.core.speed.evaluator import Evaluator

if TYPE_CHECKING:
    from offload_planner.core.fit import FitResult

NEAR_MISS = 512 * 1024**2  # predicted compute buffers were off by < 60 MiB on the bench's models


class Baselines(Evaluator):
    """The ``--n-cpu-moe N`` and ``--fit`` baselines."""

    def _ncm(self, n: int, full: bool = False) -> Candidate:
        plan = self.plan(["--n-cpu-moe", str(n)])
        return (self.full if full else self.candidate)(f"--n-cpu-moe {n}", plan)

    def n_cpu_moe_predicted(self) -> tuple[Candidate | None, Candidate | None]:
        """The smallest ``--n-cpu-moe N`` predicted to fit (fewer expert layers on the CPU is
        faster: a first guess from the bytes each GPU has room for, then the predictions around it),
        and N - 1 when it is predicted over by less than a prediction may be wrong."""
        n_layer = self.model.summary.n_layer
        top = self._ncm(n_layer)
        if top.over:
            return None, None
        n = self._n_cpu_moe_guess(top)
        # by the GPUs alone (monotonic in N; fewer layers on the CPU only lower the host's bytes)
        if not self._ncm(n).over:  # walk down while one layer fewer on the CPU still fits
            while n > 0 and not self._ncm(n - 1).over:
                n -= 1
        else:  # the guess was short: bisect above it
            lo, hi = n + 1, n_layer
            while lo < hi:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if not self._ncm(mid).over else (mid + 1, hi)
            n = hi
        lower = self._ncm(n - 1) if n > 0 else None
        return self._ncm(n), (lower if lower is not None and self.near_miss(lower) else None)

    def best_n_cpu_moe(self, n: int) -> Candidate | None:
        """From the predicted N: the smallest N that fits by a full projection (N - 1 projected
        too when its prediction missed by little)."""
        n_layer = self.model.summary.n_layer
        c = self._ncm(n, full=True)
        while c.over and n < n_layer:  # predicted to fit, over after all
            n += 1
            c = self._ncm(n, full=True)
        while n > 0 and self.near_miss(self._ncm(n - 1)):
            lower = self._ncm(n - 1, full=True)
            if lower.over:
                break
            c, n = lower, n - 1
        return c if c.fits else None

    def near_miss(self, c: Candidate) -> bool:
        """Predicted over, by less than a prediction of the compute buffers may be wrong."""
        if c.verified or not c.over:
            return False
        left = room(c.projection, self.offload)
        return all(-left[g] < NEAR_MISS for g in c.over)

    def _n_cpu_moe_guess(self, top: Candidate) -> int:
        """The smallest N whose expert layers N.. fit each layer's GPU by the bytes alone."""
        left = room(top.projection, self.offload)
        per_layer: dict[int, tuple[str, int]] = {}
        placement = top.plan.placement()
        for p in placement.items:
            t = p.tensor
            if p.device == CPU and t.role.is_routed_expert and t.layer is not None and not p.copy:
                dev = placement.layer_device(t.layer)
                d = self.devices.by_name(dev)
                if d is None:
                    continue
                size = pad(alloc_size(t, d), d.alignment)
                prev = per_layer.get(t.layer, (dev, 0))[1]
                per_layer[t.layer] = (dev, prev + size)
        n = self.model.summary.n_layer
        for il in sorted(per_layer, reverse=True):  # add layers from the top while they fit
            dev, size = per_layer[il]
            if dev not in left or size > left[dev]:
                break
            left[dev] -= size
            n = il
        return n

    @property
    def fits_by_default(self) -> bool:
        """llama-server runs its ``--fit`` on this command (the dialect's default, a GPU to fit)."""
        return self.dialect.fits_by_default and bool(self.offload_gpus)

    def llama_fit_result(self) -> FitResult | None:
        """What llama-server's own ``--fit`` makes of the command, its port's search (its dry runs),
        applied by :meth:`fit_plan` (None: it does not fit by default, or there is no GPU)."""
        if not self.fits_by_default:
            return None
        from offload_planner.core.fit import fit_for_args

        parsed = self.parse(self.base_args)
        base = self.plan([])
        # what llama-server finds free; its fit keeps its own 1 GiB target (the default margin here)
        free = [g.capacity or 0 for g in self.devices.gpus]
        return fit_for_args(self.model, self.devices, parsed, base.placement_options, base.context,
                            free_bytes=free)

    def fit_plan(self, result: FitResult | None) -> Plan | None:
        if result is None:
            return None
        base = self.plan([])
        popts, ctx = result.apply(base.placement_options, base.context, self.model.summary.n_layer,
                                  has_gpu=True)
        self.fit_result = result
        return replace(base, placement_options=popts, context=ctx)

    def llama_fit_candidate(self, plan: Plan) -> tuple[Candidate, list[str]]:
        """The ``--fit`` baseline.  Where the fitted server's MTP context can take more than the fit
        counted (:func:`~offload_planner.core.fit_extra.may_fall_short`) it is projected in full (its
        memory exact, not predicted) and, where llama.cpp's own fit then leaves a device short of its
        margin (:func:`~offload_planner.core.fit_extra.extra_shortfalls`), a note names the device
        and the MiB; the row is then over, never a fitting baseline."""
        from offload_planner.core.fit_extra import extra_shortfalls, may_fall_short

        result = self.fit_result
        if result is None or not may_fall_short(result, plan.spec):
            return self.candidate("llama.cpp --fit", plan), []

        proj = plan.projection()  # kept out of the predictions' compute buffers (self._compute)
        self.projections += 1
        c = self._make("llama.cpp --fit", plan, proj, verified=True)
        free = {g.name: g.capacity or 0 for g in self.devices.gpus}
        return c, [sf.message() for sf in extra_shortfalls(result, proj, free)]
