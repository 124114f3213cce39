"""The projector (``--mmproj``) projection against the real llama-server, per device and buffer.

The project writes two small Gemma 3 style projectors for its small gemma3 text model and four
with real shapes, gemma-3-4b-it's, Qwen2-VL-7B's, Qwen2.5-VL-7B's and Qwen3-VL-8B's (``core.synth.mmproj``,
complete sparse files, with text models of their width); llama-server loads each beside the model
on the CPU or on one or two ggml-rpc-server devices, with and without flash attention, offloaded or
not, on a chosen device.  From its log (``-lv 4``) the test takes what clip.cpp prints: the device
it uses, the ``model size``, every ``reserve_compute_meta`` compute buffer, the warmup graph's
splits and nodes, and whether flash attention is on, and compares each with the planner's
projection to the printed 0.01 MiB.
It also compares the whole plan: per device the model, KV, output, compute and projector (kind
``mmproj``: the log parser files clip's lines apart) buffers equal what ``analyse_command`` projects,
and the launch tab's comparison agrees.  The projector's weights buffer itself is not logged: its
padded size is projected, the unpadded sum is checked (equal for these shapes).

With ``--fit`` on (the default), the server adds the projector's memory to the fit's per-device
targets (by backend-registry index); the targets it prints must equal the ones the planner's fit
uses.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from tests.support.procs import free_port, running_process
from tests.support.rpc import rpc_servers
from tests.support.server_buffers import mib, rpc_devices

from offload_planner.backend.clip_log import ClipLoad, parse_clip_log
from offload_planner.backend.launch import compare
from offload_planner.backend.log_parser import parse_log
from offload_planner.core.analysis import analyse_command
from offload_planner.core.cmdline import parse_server_args
from offload_planner.core.fit import fit_for_args
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.mmproj import read_projector
from offload_planner.core.mmproj.attach import KIND, fa_setting, mmproj_setup, project_setup
from offload_planner.core.synth import SMALL_MODELS, write_model
from offload_planner.core.synth.mmproj import BIG_MMPROJ, SMALL_MMPROJ, write_mmproj

pytestmark = pytest.mark.integration

RPC_FREE = 24105 * 1024**2  # what each ggml-rpc-server reports (checked against the log below)
MiB = 1024**2

# (projector, number of RPC devices, further llama-server arguments)
CASES: list[tuple[str, int, str]] = [
    ("gemma3", 0, ""),
    ("gemma3", 0, "-fa off"),
    ("gemma3", 1, ""),
    ("gemma3", 1, "-fa off"),
    ("gemma3", 2, ""),
    ("gemma3", 2, "-fa off"),
    ("gemma3", 2, "--no-mmproj-offload"),
    ("gemma3", 2, "--no-mmproj-offload -fa off"),
    ("gemma3-448", 0, "-fa on"),
    ("gemma3-448", 1, "-fa on"),
    ("gemma3-448", 1, "-fa off"),
    ("gemma3-448", 2, "-fa off"),
    ("gemma3-448", 2, "-fa on -ts 1,3"),
    ("gemma3-448", 2, "-fa off -mmdev RPC1"),
    ("gemma3-448", 2, "--mmproj-device none -fa off"),
    ("gemma3-448", 2, "-dev RPC1"),
    ("gemma3-448", 2, "-fa off --no-mmproj-offload --mmproj-offload"),
    # real size: gemma-3-4b-it's SigLIP tower (801.50 MiB of f16 weights, 896 px, 27 blocks)
    ("gemma-3-4b-mmproj-f16", 0, ""),
    ("gemma-3-4b-mmproj-f16", 0, "-fa off"),
    ("gemma-3-4b-mmproj-f16", 1, "-fa on"),
    # real size: Qwen2.5-VL-7B's tower (1291.40 MiB; windowed attention, M-RoPE, 1288 px warmup)
    ("qwen2.5-vl-7b-mmproj-f16", 0, ""),
    ("qwen2.5-vl-7b-mmproj-f16", 0, "-fa off --image-max-tokens 1024"),
    ("qwen2.5-vl-7b-mmproj-f16", 1, "--image-max-tokens 256"),
    ("qwen2-vl-7b-mmproj-f16", 1, "--image-max-tokens 576"),
    # real size: Qwen3-VL-8B's tower (deepstack, interpolated positions; text width 4 x 4096)
    ("qwen3-vl-8b-mmproj-f16", 0, ""),
    ("qwen3-vl-8b-mmproj-f16", 1, "-fa off --image-max-tokens 1024"),
]


@pytest.fixture(scope="module")
def rpc(llama_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with rpc_servers(llama_bin_dir, 2, tmp_path_factory.mktemp("rpc")) as eps:
        yield eps


@pytest.fixture(scope="module")
def mmprojs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The loadable projectors and the real-size 4B one (a sparse file of zeros)."""
    root = tmp_path_factory.mktemp("mmproj")
    big = ("gemma-3-4b-mmproj-f16", "qwen2-vl-7b-mmproj-f16", "qwen2.5-vl-7b-mmproj-f16",
           "qwen3-vl-8b-mmproj-f16")
    specs = {**SMALL_MMPROJ, **{name: BIG_MMPROJ[name] for name in big}}
    return {name: write_mmproj(spec, root / f"{name}.gguf") for name, spec in specs.items()}


@pytest.fixture(scope="module")
def text_models(small_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Text model by width: mtmd refuses a projector whose output width is not the model's."""
    root = tmp_path_factory.mktemp("text")
    return {256: small_models["gemma3"], **{
        n: write_model(replace(SMALL_MODELS["gemma3"], n_embd=n), root / f"gemma3-{n}.gguf")[0]
        for n in (2560, 3584, 16384)}}


def _run_server(llama_server: Path, model: Path, argv: list[str], log: Path, *, fit: bool) -> str:
    cmd = [str(llama_server), "-m", str(model), "--host", "127.0.0.1", "--port", str(free_port()),
           "-lv", "4", *([] if fit else ["-fit", "off"]), *argv]
    with running_process(cmd, log_path=log, ready=r"listening on http://", timeout=120) as proc:
        pass
    return proc.output()


def _argv(rpc: list[str], n_rpc: int, path: Path, args: str) -> list[str]:
    eps = rpc[:n_rpc]
    return [*(["--rpc", ",".join(eps)] if eps else []), "-c", "2048", "-mm", str(path),
            *shlex.split(args)]


@pytest.mark.parametrize(("name", "n_rpc", "args"), CASES, ids=[f"{m}:{n}rpc:{a}" for m, n, a in CASES])
def test_mmproj_buffers_equal_llama_server(
    name: str, n_rpc: int, args: str, text_models: dict[int, Path], mmprojs: dict[str, Path],
    llama_server: Path, rpc: list[str], tmp_path: Path,
) -> None:
    argv = _argv(rpc, n_rpc, mmprojs[name], args)
    text = text_models[read_projector(mmprojs[name]).n_embd_out]
    parsed = parse_server_args(argv)
    assert not parsed.errors, parsed.errors
    devices = rpc_devices(rpc[:n_rpc], RPC_FREE)
    setup = mmproj_setup(parsed)
    assert setup is not None
    mb = project_setup(setup, devices, fa_setting(parsed.args.flash_attn))
    result = analyse_command(open_model(text), devices, parsed)

    log = _run_server(llama_server, text, argv, tmp_path / "server.log", fit=False)
    clip: ClipLoad = parse_clip_log(log.splitlines())
    buft = {d.name: d.buffer_type for d in devices}
    projected_compute = {buft[d]: mib(b) for d, b in mb.compute.items() if b > 1}
    print(f"\n{name} {n_rpc} RPC {args}: device {mb.device}, weights {mib(mb.projector.weight_bytes)} "
          f"(padded {mib(mb.weights)}), compute {projected_compute}, nodes {mb.n_nodes}; "
          f"server: {clip}")
    assert clip.backend == buft[mb.device]
    assert clip.model_mib == mib(mb.projector.weight_bytes)
    assert clip.flash_attn == mb.flash_attn
    assert (clip.n_splits, clip.n_nodes) == (mb.n_splits, mb.n_nodes)
    assert clip.compute_mib == projected_compute

    # the whole plan per device and kind; the log parser files clip's lines as kind mmproj (its
    # logged weights are the unpadded sum, equal to the padded buffer for these shapes); with -dev the
    # model's layers on the selected device only, the projector on its first
    report = parse_log(log.splitlines())
    actual = report.by_device({ep: f"RPC{i}" for i, ep in enumerate(rpc)})
    mismatches = []
    for dm in result.projection.devices:
        for kind in ("model", "kv", "output", "compute", KIND):
            proj = mib(dm.total(kind))
            act = actual.get(dm.device.name, {}).get(kind, 0.0)
            if abs(proj - act) > 0.011:
                mismatches.append(f"{dm.device.name} {kind}: projected {proj} actual {act}")
    assert not mismatches, "\n".join(mismatches)
    cmp = compare(result.projection, report, {ep: f"RPC{i}" for i, ep in enumerate(rpc)})
    assert cmp.ok and any(t.kind == KIND for t in cmp.totals)  # the launch tab's check agrees
    weights = [b for dm in result.projection.devices for b in dm.buffers
               if b.kind == KIND and b.why.startswith("projector weights")]
    assert [(b.device, b.bytes) for b in weights] == [(mb.device, mb.weights)]


_TARGET = re.compile(r"common_params_fit_impl:\s+- (?P<dev>RPC\d+) \(.*vs\. target of\s+(?P<mib>\d+)")
_FIT_TARGET = re.compile(r"- (?P<dev>RPC\d+): .*vs\. target of (?P<mib>\d+)")


@pytest.mark.parametrize(("name", "args"), [("gemma3", ""), ("gemma3-448", "-fa off"),
                                             ("gemma3-448", "--no-mmproj-offload -fa off"),
                                             ("gemma3-448", "-mmdev RPC1 -fa off")])
def test_fit_targets_count_the_projector_as_llama_server(
    name: str, args: str, small_models: dict[str, Path], mmprojs: dict[str, Path],
    llama_server: Path, rpc: list[str], tmp_path: Path,
) -> None:
    argv = _argv(rpc, 2, mmprojs[name], args)
    parsed = parse_server_args(argv)
    devices = rpc_devices(rpc, RPC_FREE)
    model = open_model(small_models["gemma3"])
    result = analyse_command(model, devices, parsed)
    fitted = fit_for_args(model, devices, parsed, result.plan.placement_options, result.plan.context,
                          free_bytes=[RPC_FREE, RPC_FREE])
    assert fitted is not None
    ours = {m["dev"]: int(m["mib"]) for line in fitted.log if (m := _FIT_TARGET.search(line))}

    text = _run_server(llama_server, small_models["gemma3"], argv, tmp_path / "server.log", fit=True)
    assert "24105 total" in text  # the free memory the fit was given is what the server saw
    theirs = {m["dev"]: int(m["mib"]) for m in _TARGET.finditer(text)}
    print(f"\n{name} {args}: targets planner {ours}, server {theirs}")
    assert theirs and ours == theirs
    assert any(v != 1024 for v in theirs.values())  # the projector moved a target

