"""``--fit`` with an MTP context or a draft model, as the pinned llama.cpp runs it.

``common_init_result`` (common/common.cpp:1240-1266) builds the extra model's parameters
(``params_dft``, ``mparams_dft``, ``cparams_dft``) from the command *before* ``common_fit_params``
writes ``-ngl`` and the ``-ot`` overrides, and the fit measures the extra with those parameters at every
context it tries (``add_extra_memory``, common/fit.cpp:203-259; ``shares_model`` zeroes an MTP
context's weights).  The server loads the fitted target first (tools/server/server-context.cpp:1208),
then the draft with its own unchanged parameters (common/speculative.cpp:2623) or the MTP context on
the fitted target model (speculative.cpp:2643), both at ``llama_n_ctx(ctx_tgt)`` (2611).  So a draft
model allocates what the fit counted, and an MTP context allocates what the *fitted* placement gives
it: when the fit moves the NextN block's experts to the CPU, the MTP graph's compute buffer takes their
copies (op offload) and llama.cpp's own fit leaves the GPU short of its margin.  Real header-only
models written by the project's synth.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.fit import DEFAULT_MARGIN, SUCCESS, FitResult, device_memory, fit_for_args
from offload_planner.core.fit_extra import extra_shortfalls, may_fall_short
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.memory import Projection
from offload_planner.core.model import Model
from offload_planner.core.plan import Plan, plan_from_args
from offload_planner.core.speed.efficiency import defaults_for
from offload_planner.core.speed.fastest import fastest_plan
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.synth import write_model
from offload_planner.core.synth.catalog import BIG_MODELS
from offload_planner.core.units import GiB, MiB

RES = Path(__file__).resolve().parents[2] / "resources"
MTP_ARGS = ["-c", "32768", "--spec-type", "draft-mtp"]


@pytest.fixture(scope="module")
def glm_air(tmp_path_factory: pytest.TempPathFactory) -> Model:
    root = tmp_path_factory.mktemp("glm_air_fit")
    [path] = write_model(BIG_MODELS["GLM-4.5-Air-Q4_K_M"], root / "glm-air.header.gguf", header_only=True)
    return open_model(str(path))


def _devices(gpu: str) -> DeviceSet:
    return DeviceSet(parse_device_decl("CPU=256GiB,ram=4xDDR5-5600"), (parse_device_decl(f"CUDA0={gpu}"),))


def _fit(model: Model, ds: DeviceSet, argv: list[str]) -> tuple[Plan, FitResult, Plan]:
    parsed = parse_server_args(argv)
    plan = plan_from_args(model, ds, parsed)
    result = fit_for_args(model, ds, parsed, plan.placement_options, plan.context,
                          free_bytes=[g.capacity or 0 for g in ds.gpus])
    assert result is not None
    popts, ctx = result.apply(plan.placement_options, plan.context, model.summary.n_layer, has_gpu=True)
    return plan, result, replace(plan, placement_options=popts, context=ctx)


def _owned(proj: Projection, dev: str, owner: str, kinds: tuple[str, ...] = ("kv", "compute")) -> int:
    return sum(b.bytes for b in proj.device(dev).buffers if b.owner == owner and b.kind in kinds)


def test_fit_counts_the_mtp_context_as_the_command_places_it(glm_air: Model) -> None:
    """GLM-4.5-Air with MTP on a 24 GiB GPU: the fit counts the MTP context's KV and compute as the
    command as written places them (everything on the GPU: no weights copied), succeeds, and moves
    the NextN block's experts to the CPU; projected as the server allocates it, the fitted command's
    MTP context is larger and CUDA0 ends up inside the 1 GiB margin, by exactly what
    extra_shortfalls reports."""
    ds = _devices("24GiB")
    plan, result, fitted = _fit(glm_air, ds, MTP_ARGS)
    assert result.status == SUCCESS and result.layers_changed
    assert may_fall_short(result, plan.spec)
    as_written = plan.projection()
    counted = result.extra_counted["CUDA0"]
    assert counted == _owned(as_written, "CUDA0", "mtp")
    main = device_memory(glm_air, ds, fitted.placement_options, fitted.context)
    limit = (ds.gpus[0].capacity or 0) - DEFAULT_MARGIN
    assert main.used[0] + counted <= limit  # what the fit saw: it fits
    proj = fitted.projection()
    devs = proj.placement.tensor_devices()
    assert {devs[f"blk.46.ffn_{k}_exps.weight"] for k in ("gate", "up", "down")} == {"CPU"}
    allocated = _owned(proj, "CUDA0", "mtp", ("model", "kv", "compute", "output"))
    assert allocated > counted + 256 * MiB  # the NextN experts' copies in the MTP graph's compute
    over = proj.device("CUDA0").resident() - limit
    assert over > 0
    [short] = extra_shortfalls(result, proj, {"CUDA0": 24 * GiB})
    assert (short.device, short.over, short.counted, short.allocated) == ("CUDA0", over, counted, allocated)
    msg = short.message()
    assert msg.startswith(f"llama.cpp's own --fit leaves CUDA0 {over / MiB:.0f} MiB short of the 1024 MiB")
    assert "MTP context (1 NextN layer)" in msg


def test_without_mtp_the_fitted_command_keeps_the_margin(glm_air: Model) -> None:
    ds = _devices("24GiB")
    _, result, fitted = _fit(glm_air, ds, ["-c", "32768"])
    assert result.status == SUCCESS and result.extra_counted == {}
    proj = fitted.projection()
    assert proj.device("CUDA0").resident() <= 24 * GiB - DEFAULT_MARGIN
    assert extra_shortfalls(result, proj, {"CUDA0": 24 * GiB}) == []


def test_plan_and_fit_say_llama_cpp_fit_is_over_with_mtp(glm_air: Model) -> None:
    """`plan` notes the shortfall beside the fit's own note; the `fit` command's llama.cpp --fit row is
    projected in full and over on CUDA0, with the same note (without MTP: a fitting row, no note)."""
    ds = _devices("24GiB,bw=936GB/s")
    analysis = analyse_command(glm_air, ds, parse_server_args(MTP_ARGS), command=True, fit=True)
    assert analysis.fit is not None
    [short] = [n for n in analysis.fit.notes if n.startswith("llama.cpp's own --fit leaves CUDA0 ")]
    hw = hardware_for(ds, threads=16)
    eff = defaults_for("llama.cpp")
    r = fastest_plan(glm_air, ds, MTP_ARGS, hw, goal="tg", eff=eff)
    [fit] = [c for c in r.candidates if c.label == "llama.cpp --fit"]
    assert fit.verified and not fit.fits and fit.over == ["CUDA0"]
    assert short in r.notes
    plain = fastest_plan(glm_air, ds, ["-c", "32768"], hw, goal="tg", eff=eff)
    [fit] = [c for c in plain.candidates if c.label == "llama.cpp --fit"]
    assert fit.fits and not any("llama.cpp's own --fit" in n for n in plain.notes)


def test_a_draft_model_allocates_what_the_fit_counted(tmp_path: Path) -> None:
    """The draft keeps its own parameters through the fit (common/speculative.cpp:2623), so the
    fitted command's draft takes on the GPU what the fit's dry runs counted: no shortfall."""
    qwen = open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))
    spec = replace(BIG_MODELS["Llama-3.1-70B-Q4_K_M"], name="draft", n_layer=4)
    [draft] = write_model(spec, tmp_path / "draft.header.gguf", header_only=True)
    ds = _devices("12GiB")
    plan, result, fitted = _fit(qwen, ds, ["-c", "8192", "-md", str(draft)])
    assert result.status == SUCCESS and result.layers_changed
    assert not may_fall_short(result, plan.spec)
    proj = fitted.projection()
    drafted = _owned(proj, "CUDA0", "draft", ("model", "kv", "compute", "output"))
    assert drafted > 2 * GiB
    assert result.extra_counted["CUDA0"] == drafted
    assert extra_shortfalls(result, proj, {"CUDA0": 12 * GiB}) == []
