"""The simulations and the cycle collector: a recorded reference leaves no cyclic garbage, and what the
simulations leave is frozen (``gc.freeze``) only where a CLI command asks for it."""

from __future__ import annotations

import contextlib
import gc
import io
from collections.abc import Iterator

import pytest

from offload_planner import cli
from offload_planner.cli import demo_model_path
from offload_planner.core import compute as C
from offload_planner.core.compute import incremental as CI
from offload_planner.core.compute.simulate import freezing_after_simulations, no_cyclic_gc
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import ContextParams, resolve_context
from offload_planner.core.model import Model
from offload_planner.core.placement import Override, PlacementOptions
from offload_planner.core.plan import Plan

GIB = 1 << 30


@pytest.fixture
def collector_on() -> Iterator[None]:
    """The collector on (as in a CLI process) and, after the test, what it froze back in the oldest
    generation (the test process is not a command that ends)."""
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        gc.unfreeze()
        if not was:
            gc.disable()


def _simulate(model: Model, n_gpu: int = 2) -> None:
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 512 * GIB),
                        tuple(Device(f"CUDA{i}", DeviceKind.CUDA, 24 * GIB, 24 * GIB) for i in range(n_gpu)))
    params = ContextParams(n_ctx=8192)
    ctx = resolve_context(params, model.summary.n_ctx_train, model.summary.n_swa)
    opts = PlacementOptions(n_gpu_layers=model.summary.n_layer + 1, overrides=(Override("exps", "CPU"),))
    with CI.recording_first_sights():
        placement = Plan(model, devices, opts, params).placement()
        C.simulate(model, devices, placement, ctx, params, incremental=True)


def test_recorded_reference_leaves_no_cyclic_garbage() -> None:
    """Recording a reference (DeepSeek-V3's two graphs) and dropping it frees everything by reference
    counting: nothing is left for the cycle collector (its allocator pointed back at its recorder)."""
    model = open_model(demo_model_path())
    CI._REFS.clear()
    CI._SEEN.clear()
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        before = dict(CI.stats)
        _simulate(model)
        assert CI.stats["full"] - before["full"] == 2  # both graphs recorded
        CI._REFS.clear()
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


def test_freezing_after_simulations_only_inside(collector_on: None) -> None:
    model = open_model(demo_model_path())
    frozen = gc.get_freeze_count()
    _simulate(model)
    assert gc.get_freeze_count() == frozen  # the default: nothing frozen
    with freezing_after_simulations():
        _simulate(model)
        assert gc.get_freeze_count() > frozen
        assert gc.get_count()[0] < 100  # the next collection has (almost) nothing young to walk
        frozen = gc.get_freeze_count()
        gc.disable()  # a window: its own timer collects, the simulations never freeze
        try:
            _simulate(model)
        finally:
            gc.enable()
        assert gc.get_freeze_count() == frozen
        with no_cyclic_gc():
            with no_cyclic_gc():
                pass
            assert gc.get_freeze_count() == frozen  # an inner window leaves the collector off
        assert gc.get_freeze_count() >= frozen
    frozen = gc.get_freeze_count()
    _simulate(model)
    assert gc.get_freeze_count() == frozen  # off again after


PLAN = ["plan", str(demo_model_path()), "--no-detect", "--device", "CUDA0=24GiB", "--device", "CPU=512GiB",
        "--json"]


def test_cli_command_freezes_as_a_process_not_as_a_caller(collector_on: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``main()`` of the console script freezes what a ``plan``'s simulations leave; a caller of
    ``main(argv)`` (a test, a script) keeps its collector as it was."""
    frozen = gc.get_freeze_count()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(PLAN) == 0
    assert gc.get_freeze_count() == frozen
    monkeypatch.setattr("sys.argv", ["offload-planner", *PLAN])
    with contextlib.redirect_stdout(out):
        assert cli.main() == 0
    assert gc.get_freeze_count() > frozen
    assert "launch" not in cli.FREEZING and "gui" not in cli.FREEZING  # Qt event loops


def test_plan_runs_with_the_collector_off_and_gives_it_back(collector_on: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``plan``'s objects are acyclic: the collector stays off from reading the arguments to the text
    (not only during its simulations), and is on again after, for a caller of ``main(argv)``."""
    from offload_planner.core import plan_report

    seen: list[bool] = []
    text = plan_report.plan_text

    def spy(*args: object, **kwargs: object) -> str:
        seen.append(gc.isenabled())
        return text(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(plan_report, "plan_text", spy)
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(PLAN[:-1]) == 0  # the text, not --json
    assert seen == [False]
    assert gc.isenabled()
