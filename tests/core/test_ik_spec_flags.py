"""ik_llama.cpp's speculative flags as its parser reads them (``gpt_params_find_arg`` and
``common_speculative_validate_chain``, common/common.cpp at ikawrakow/ik_llama.cpp 8337e4cd) and the
draft model the ik dialect projects from them (``common_speculative_load_draft_model``,
common/speculative.cpp 1939-1999).  The draft context's buffers are checked against ik's own library
in tests/integration/test_ik_draft.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from offload_planner.core.analysis import analyse_command
from offload_planner.core.buffer import IK_CPU_BUFFER_EXTRA
from offload_planner.core.cmdline import check_semantics, parse_server_args
from offload_planner.core.cmdline.model import DraftArgs, ParsedArgs
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.dialects import IK, IK_2025, LLAMA_CPP, Dialect
from offload_planner.core.engine import placement_options
from offload_planner.core.extra_context import DRAFT
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.placement import Placement, place, selected_gpus
from offload_planner.core.speculative import SpecSettings, spec_refusals, spec_settings

GiB = 1024**3


def _errors(line: str) -> list[str]:
    return [e.message for e in parse_server_args(["-m", "x.gguf", *line.split()], dialect=IK).errors]


def _words(line: str) -> list[str]:
    return line.split(" ")


def _draft(line: str) -> DraftArgs:
    return parse_server_args(_words(line), dialect=IK).args.draft


def test_draft_flags_are_read() -> None:
    d = _draft("-md d.gguf -ngld 1 -devd CUDA1 -cd 512 -ctkd q8_0 -ctvd q4_0 "
               "--spec-type draft:n_max=5,p_min=0.5")
    assert (d.model, d.n_gpu_layers, d.devices, d.ctx_size, d.cache_type_k, d.cache_type_v) == (
        "d.gguf", 1, ["CUDA1"], 512, "q8_0", "q4_0")
    assert d.types == ["draft"] and d.stages == [("draft", 5, -1)]
    assert IK.draft_n_max(d) == 5
    long = _draft("--model-draft d --n-gpu-layers-draft 2 --device-draft CUDA0 --spec-type ngram-mod "
                  "--spec-type draft")
    assert (long.model, long.n_gpu_layers, long.devices) == ("d", 2, ["CUDA0"])
    assert long.types == ["ngram_mod", "draft"]
    assert IK.draft_n_max(long) == 16  # common_params_speculative::n_max


@pytest.mark.parametrize(("line", "message"), [
    ("-md d --spec-type draft-simple", "unknown speculative stage type: draft-simple"),  # mainline's name
    ("--spec-type draft", "error: invalid speculative stage configuration: draft speculative stage requires "
                          "a draft model or draft params"),
    ("-md d --spec-type draft:n_min=20", "error: invalid speculative stage configuration: speculative stage "
                                         "has n_min greater than n_max"),
    ("-md d --spec-type draft --spec-type draft", "error: invalid speculative stage configuration: duplicate "
                                                  "speculative stage type in chain: draft"),
    ("-md d --spec-type draft --spec-type ngram-mod", "error: invalid speculative stage configuration: "
                                                      "two-stage speculative mode currently requires a "
                                                      "self-spec stage first"),
    ("-md d --spec-type draft:width=3", "unknown speculative stage parameter: width"),
    ("-md d --spec-type draft:n_max=-1", "speculative stage n_max must be >= 0"),
    ("-md d --spec-type draft -devd CUDA-1", "no devices specified"),
    ("-md d --spec-type draft -np 2", "Speculative decoding is currently limited to a single server slot "
                                      "(-np 1)."),
])
def test_ik_refuses_as_its_parser_and_server_do(line: str, message: str) -> None:
    assert message in _errors(line)


def test_ik_refuses_a_quantized_draft_v_cache_without_flash_attention() -> None:
    parsed = parse_server_args(_words("-m x -fa off -md d --spec-type draft -ctvd q8_0"), dialect=IK)
    errors = [e.message for e in check_semantics(parsed, ["CPU"])]
    assert "Quantized V cache cannot be used without flash attention" in errors
    idle = parse_server_args(_words("-m x -fa off -md d -ctvd q8_0"), dialect=IK)  # never loaded
    assert check_semantics(idle, ["CPU"]) == []


@pytest.mark.parametrize(("argv", "env", "flag"), [
    (["-ctv", "q8_0", "-fa", "on", "-draft", "-fa off"], {}, "-draft"),  # inherited -ctv, ARGS' -fa off
    (["-fa", "on", "--draft-params", "-ctv q8_0 -fa off"], {}, "--draft-params"),
    (["-fa", "on", "-draft", "-fa off"], {"LLAMA_ARG_CACHE_TYPE_V": "q8_0"}, "-draft"),
    (["-ctv", "q8_0", "-draft", "-c 512"], {"LLAMA_ARG_FLASH_ATTN": "0"}, None),  # the main's refusal
    (["-ctvd", "q8_0", "-fa", "off", "-draft", "-fa on"], {}, None),  # ARGS turn it back on: loads
    (["-ctvd", "q8_0", "-fa", "off"], {}, "-ctvd"),
])
def test_ik_checks_the_draft_v_cache_as_the_draft_params_leave_it(argv: list[str], env: dict[str, str],
                                                                    flag: str | None) -> None:
    """params_dft's V type and -fa are -ctvd (else -ctv) and the main -fa, then the environment and ARGS
    (common/speculative.cpp 1946-1966); common_model_params_to_llama throws for a quantized V cache
    without flash attention (common/common.cpp 4303-4305). The planner read -ctvd and the main -fa only:
    it refused the fifth line, which loads, and planned the first three, which stop."""
    parsed = parse_server_args(["-m", "x", "-md", "d", "--spec-type", "draft", *argv], dialect=IK, env=env)
    assert not parsed.errors, parsed.errors
    draft = [e for e in check_semantics(parsed, ["CPU"])
             if e.message == "Quantized V cache cannot be used without flash attention"]
    assert [e.flag for e in draft] == ([flag] if flag else []), draft


def test_ik_accepts_a_draft_chain_and_drops_mtp_with_slots() -> None:
    assert _errors("-md d --spec-type ngram-mod --spec-type draft:n_max=4") == []
    assert _errors("--spec-ckpt-mode per-step") == []  # common.cpp 1587 (--recurrent-ckpt-mode's new name)
    parsed = parse_server_args(["-m", "x", "--spec-type", "mtp", "-np", "2"], dialect=IK)
    assert parsed.errors == [] and any("removing the MTP stage" in w.message for w in parsed.warnings)


def _gpu() -> DeviceSet:
    return DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB),
                     (Device("CUDA0", DeviceKind.CUDA, 24 * GiB, 24 * GiB),
                      Device("CUDA1", DeviceKind.CUDA, 24 * GiB, 24 * GiB)))


def _spec(small_models: dict[str, Path], line: str, dialect: Dialect = IK) -> SpecSettings:
    draft = str(small_models["llama-draft"])
    parsed = parse_server_args(line.replace("DRAFT", draft).split(), dialect=dialect)
    return spec_settings(_gpu(), parsed, dialect, placement_options, open_model(draft))


def test_ik_draft_takes_the_main_command_line(small_models: dict[str, Path]) -> None:
    """``params_dft = params_base``: the main -ot and cache types reach the draft; -ngld, -devd, -ctkd
    override; the context is the main -c as given (-cd only without it), one sequence."""
    spec = _spec(small_models, r"-c 1000 -cd 300 -ctk q8_0 -ot blk\.0\.=CPU -md DRAFT --spec-type draft")
    d = spec.draft
    assert d is not None and spec.drafting and not spec.mtp and spec.n_max == 16
    assert (d.type_k, d.type_v, d.n_ctx) == ("q8_0", "f16", None)  # None: the main -c as requested
    assert [o.pattern for o in d.placement_options.overrides] == [r"blk\.0\."]
    assert d.placement_options.n_gpu_layers > d.model.summary.n_layer  # -ngld unset: every layer
    pinned = _spec(small_models, r"-c 1000 -ot blk\.0\.=CPU -md DRAFT --spec-draft-n-max 2", LLAMA_CPP)
    assert pinned.draft is not None and pinned.draft.placement_options.overrides == ()  # -otd only
    own = _spec(small_models, "-md DRAFT --spec-type draft -cd 300 -ngld 1 -devd CUDA1 -ctkd q4_0")
    assert own.draft is not None and (own.draft.n_ctx, own.draft.type_k) == (300, "q4_0")
    assert [g.name for g in own.draft.devices.gpus] == ["CUDA1"]
    assert own.draft.placement_options.n_gpu_layers == 1
    assert _spec(small_models, "-md DRAFT --spec-type draft").draft.n_ctx == 0  # type: ignore[union-attr]


def test_ik_draft_devices_and_dflash_layers(small_models: dict[str, Path]) -> None:
    """ik's draft offloads to ``-devd``, else the main ``-dev`` (common/speculative.cpp 1950:
    ``params_dft.devices = params.devices.empty() ? params_base.devices : params.devices``); a
    ``dflash``/``dspark`` stage's draft without ``-ngld`` takes the main ``-ngl`` (1981-1983), a plain
    draft's takes the library default (every layer)."""
    def gpus(line: str, dialect: Dialect = IK) -> list[str]:
        d = _spec(small_models, line, dialect).draft
        assert d is not None
        return [g.name for g in selected_gpus(d.devices, d.placement_options)]

    def ngl(line: str) -> int:
        d = _spec(small_models, line).draft
        assert d is not None
        return d.placement_options.n_gpu_layers

    assert gpus("-dev CUDA1 -md DRAFT --spec-type draft") == ["CUDA1"]
    assert gpus("-dev CUDA1 -devd CUDA0 -md DRAFT --spec-type draft") == ["CUDA0"]
    assert gpus("-dev none -md DRAFT --spec-type draft") == []
    assert gpus("-md DRAFT --spec-type draft") == ["CUDA0", "CUDA1"]
    n_layer = open_model(str(small_models["llama-draft"])).summary.n_layer
    for kind in ("dflash", "dspark"):
        assert ngl(f"-ngl 1 -md DRAFT --spec-type {kind}") == 1
        assert ngl(f"-ngl 1 -ngld 2 -md DRAFT --spec-type {kind}") == 2
        assert ngl(f"-ngl 1 -ngld -1 -md DRAFT --spec-type {kind}") == 1
        assert ngl(f"-md DRAFT --spec-type {kind}") > n_layer
    assert ngl("-ngl 1 -md DRAFT --spec-type draft") > n_layer
    # -draft "ARGS" is parsed onto the draft's parameters after -devd/-ngld (1957-1966), before the
    # dflash -ngl rule: its -dev and a negative -ngl count as the draft's own
    draft = str(small_models["llama-draft"])
    for own, want in (("-dev CUDA1 -ngl 2", (["CUDA1"], 2)), ("-ngl -1", (["CUDA0", "CUDA1"], 1))):
        argv = ["-ngl", "1", "-md", draft, "--spec-type", "dflash", "-draft", own]
        parsed = parse_server_args(argv, dialect=IK)
        d = spec_settings(_gpu(), parsed, IK, placement_options, open_model(draft)).draft
        assert d is not None
        assert ([g.name for g in selected_gpus(d.devices, d.placement_options)],
                d.placement_options.n_gpu_layers) == want
    # the rest of a dflash draft is not a plain draft's and the plan says what it leaves out
    notes = _spec(small_models, "-md DRAFT --spec-type dflash").notes
    assert any("plain draft's, which it is not" in n and "cross_ctx (512 unless given)" in n
               and "cross-attention cache per draft layer" in n for n in notes), notes
    assert not any("cross" in n for n in _spec(small_models, "-md DRAFT --spec-type draft").notes)


def test_ik_refuses_a_graph_split_draft_on_one_device(small_models: dict[str, Path]) -> None:
    """The draft inherits ``-sm graph`` (``params_dft = params_base``) and ik's loader throws for a graph
    or attn split over fewer than two devices of an architecture it splits that way (src/llama.cpp
    4369-4372): a draft on one GPU (``-devd``, or the main ``-dev``) stops the server; on both GPUs, with
    ``-draft "-sm layer"`` or not loaded (no draft stage) it is not refused; mainline has no graph split."""
    draft = str(small_models["llama-draft"])

    def refused(line: str, *own: str) -> list[str]:
        parsed = parse_server_args([*line.replace("DRAFT", draft).split(), *own], dialect=IK)
        spec = spec_settings(_gpu(), parsed, IK, placement_options, open_model(draft))
        return [r for r in spec_refusals(open_model(draft), spec) if "split mode 'graph'" in r]

    for line in ("-sm graph -devd CUDA0 -md DRAFT --spec-type draft",
                 "-sm attn -dev CUDA1 -md DRAFT --spec-type draft",
                 "-sm graph -devd none -md DRAFT --spec-type dflash"):
        [msg] = refused(line)
        assert msg.startswith("ik_llama.cpp stops loading the draft model llama-draft.gguf") and "-sm " in msg
    assert not refused("-sm graph -md DRAFT --spec-type draft")
    assert not refused("-sm graph -devd CUDA0 -md DRAFT --spec-type draft", "-draft", "-sm layer")
    assert not refused("-sm graph -devd CUDA0 -md DRAFT")  # no stage: ik does not load it
    assert not refused("-sm layer -devd CUDA0 -md DRAFT --spec-type draft")
    model = open_model(small_models["llama"])
    parsed = parse_server_args(f"-sm graph -devd CUDA0 -md {draft} --spec-type draft".split(), dialect=IK)
    warned = analyse_command(model, _gpu(), parsed, IK).warnings
    assert any("stops loading the draft model" in w for w in warned), warned


def test_ik_projects_the_draft_context(small_models: dict[str, Path]) -> None:
    """The draft's weights, KV (its own cells), one sequence's logits and its compute, as draft buffers;
    before ik's build of August 2025 (the 2025 dialect) the server had no drafting: nothing."""
    model = open_model(small_models["llama"])
    cpu = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
    line = f"-c 1100 -md {small_models['llama-draft']} --spec-type draft"
    projection = analyse_command(model, cpu, parse_server_args(line.split(), dialect=IK), IK).projection
    assert projection is not None
    kinds = {b.kind: b.bytes for b in projection.buffers() if b.owner == DRAFT}
    assert set(kinds) == {"model", "kv", "output", "compute"}
    # one sequence's logits (n_seq_max 1, whatever -np), in a plain CPU buffer with ik's extra
    n_vocab = open_model(small_models["llama-draft"]).summary.n_vocab
    assert kinds["output"] == 4 * n_vocab + IK_CPU_BUFFER_EXTRA
    older = analyse_command(model, cpu, parse_server_args(line.split(), dialect=IK_2025), IK_2025).projection
    assert older is not None
    assert not [b for b in older.buffers() if b.owner == DRAFT]


def test_ik_draft_inherits_n_cpu_moe_and_mtp_is_noted(small_models: dict[str, Path]) -> None:
    """The main --n-cpu-moe reaches ik's draft (``params_dft.ncmoe``), expanded over the draft's own
    expert layers; mainline's draft takes only -cmoed/-ncmoed.  ik's mtp stage is projected; it is not
    and says so only on a ``-md`` companion; with -np 2 ik drops it (and so does the parser)."""
    moe = str(small_models["qwen3moe"])
    line = ["-c", "1000", "--n-cpu-moe", "1", "-md", moe, "--spec-type", "draft"]
    parsed = parse_server_args(line, dialect=IK)
    spec = spec_settings(_gpu(), parsed, IK, placement_options, open_model(moe))
    assert spec.draft is not None
    assert [o.source for o in spec.draft.placement_options.overrides] == ["--n-cpu-moe"]
    # ik's mtp stage on the main model is projected (tests/integration/test_ik_mtp.py): no note; on a
    # -md companion it is not, and says so; with -np 2 ik drops it (and so does the parser)
    mtp = parse_server_args(["-c", "1000", "--spec-type", "mtp"], dialect=IK)
    projected = spec_settings(_gpu(), mtp, IK, placement_options)
    assert projected.active and projected.mtp and projected.notes == ()
    analysis = analyse_command(open_model(small_models["glm4moe"]), _gpu(), mtp, IK)
    assert not any("ik_llama.cpp's MTP context" in w for w in analysis.warnings), analysis.warnings
    assert analysis.projection is not None and [e.key for e in analysis.projection.extras] == ["mtp"]
    companion = parse_server_args(["-c", "1000", "--spec-type", "mtp", "-md", moe], dialect=IK)
    noted = spec_settings(_gpu(), companion, IK, placement_options, open_model(moe))
    assert any("MTP context on the -md companion" in n and "not projected" in n for n in noted.notes)
    slots = parse_server_args(["-c", "1000", "--spec-type", "mtp", "-np", "2"], dialect=IK)
    dropped = spec_settings(_gpu(), slots, IK, placement_options)
    assert dropped.notes == () and not dropped.mtp


def test_ik_draft_follows_the_plans_context(small_models: dict[str, Path]) -> None:
    """With a main -c the draft's context is that -c as requested (not the padded cells): a plan whose
    context is edited takes its draft along; -cd without -c stays the draft's own."""
    from dataclasses import replace

    from offload_planner.core.engine import context_params
    from offload_planner.core.memory import resolve_context
    from offload_planner.core.speculative import extra_contexts

    model = open_model(small_models["llama"])
    cpu = DeviceSet(Device("CPU", DeviceKind.CPU, 64 * GiB, 64 * GiB), ())
    draft = str(small_models["llama-draft"])

    def draft_kv(line: str, n_ctx: int | None = None) -> int:
        parsed = parse_server_args(line.split(" "), dialect=IK)
        spec = spec_settings(cpu, parsed, IK, placement_options, open_model(draft))
        main, _ = context_params(model, parsed, IK)
        main = main if n_ctx is None else replace(main, n_ctx=n_ctx)
        ctx = resolve_context(main, model.summary.n_ctx_train, model.summary.n_swa)
        placement = plan_placement(model, cpu, parsed)
        (extra,) = extra_contexts(model, cpu, placement, main, ctx, spec)
        return extra.total("kv")

    line = f"-c 1100 -md {draft} --spec-type draft"
    assert draft_kv(line, 2200) > draft_kv(line) == draft_kv(f"-c 2200 -md {draft} --spec-type draft", 1100)
    own = f"-cd 700 -md {draft} --spec-type draft"
    assert draft_kv(own, 2200) == draft_kv(own) < draft_kv(line)


def plan_placement(model: Model, devices: DeviceSet, parsed: ParsedArgs) -> Placement:
    return place(model, devices, placement_options(model, devices, parsed, IK))


def test_ik_draft_survives_export_and_a_saved_plan(small_models: dict[str, Path], tmp_path: Path) -> None:
    """The exported command pins the main -c, which ik's draft would take instead of -cd: the plan
    keeps the draft's own context as -draft "-c N"; a saved plan's draft is read again from its whole
    command (ik's draft inherits the main -ot and -ctk), so it comes back as projected."""
    from offload_planner.core.plan import plan_command, plan_from_args
    from offload_planner.core.plan_file import PlanFile, load_plan, save_plan

    model = open_model(small_models["llama"])
    draft = str(small_models["llama-draft"])
    line = rf"-cd 700 -ctk q8_0 -ot blk\.0\.=CPU -md {draft} --spec-type draft"
    plan = plan_from_args(model, _gpu(), parse_server_args(line.split(" "), dialect=IK), IK)
    assert plan.spec is not None and plan.spec.draft is not None and plan.spec.draft.n_ctx == 700
    exported = plan_command(plan)
    assert exported[exported.index("-draft") + 1] == "-c 700"
    again = plan_from_args(model, _gpu(), parse_server_args(exported, dialect=IK), IK)
    assert again.spec is not None and again.spec.draft is not None and again.spec.draft.n_ctx == 700
    save_plan(tmp_path / "p.json", PlanFile.of(plan))
    loaded, _ = load_plan(tmp_path / "p.json").to_plan(model)
    d = loaded.spec.draft if loaded.spec is not None else None
    assert d is not None and (d.n_ctx, d.type_k) == (700, "q8_0")
    # the exported -ot is the main model's shortest set, which ik applies to the draft too: same places
    first = plan.spec.draft
    assert place(d.model, d.devices, d.placement_options).tensor_devices() == place(
        first.model, first.devices, first.placement_options).tensor_devices()
    assert "CPU" in place(d.model, d.devices, d.placement_options).tensor_devices().values()


def test_ik_offers_no_draft_tensor_moves(small_models: dict[str, Path]) -> None:
    """ik has no -otd (the window's draft moves write one): its draft takes the main -ot list."""
    from offload_planner.core.draft_moves import DRAFT_PREFIX, draft_moves_for
    from offload_planner.core.plan import plan_from_args

    model = open_model(small_models["llama"])
    draft = str(small_models["llama-draft"])
    name = [DRAFT_PREFIX + "blk.0.attn_q.weight"]
    for dialect, spec_type, moves in ((LLAMA_CPP, "draft-simple", 1), (IK, "draft", 0)):
        line = ["-c", "1000", "-md", draft, "--spec-type", spec_type]
        plan = plan_from_args(model, _gpu(), parse_server_args(line, dialect=dialect), dialect)
        assert plan.spec is not None and plan.spec.draft is not None, dialect
        assert len(draft_moves_for(plan, name, "CPU")) == moves, dialect


def test_ik_mtp_context_holds_no_weights(small_models: dict[str, Path]) -> None:
    """ik's MTP context runs on the main model's weights: its buffers are a cache, outputs and compute,
    never a second copy of the MLA tensors ik computes at load (deepseek2's ``attn_k_b``/``attn_v_b``
    are the main model's, counted once)."""
    from offload_planner.core.extra_context import MTP

    parsed = parse_server_args(["-c", "1100", "--spec-type", "mtp"], dialect=IK)
    projection = analyse_command(open_model(small_models["deepseek2-mtp"]), _gpu(), parsed, IK).projection
    assert projection is not None
    kinds = sorted({b.kind for b in projection.buffers() if b.owner == MTP})
    assert kinds == ["kv", "output"], kinds  # ik 55d3c05 has no MTP graph for deepseek2: no compute
    warned = analyse_command(open_model(small_models["deepseek2-mtp"]), _gpu(), parsed, IK).warnings
    assert any("MTP graph for deepseek2 is not simulated" in w for w in warned), warned
    glm = analyse_command(open_model(small_models["glm4moe"]), _gpu(), parsed, IK).warnings
    assert not any("MTP graph" in w for w in glm), glm
