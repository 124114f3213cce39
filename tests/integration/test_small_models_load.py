"""llama.cpp loads every synthetic model, and our reader sees what llama.cpp sees.

Small models: the real ``llama-server`` must reach "listening"; its ``-lv 4`` load log is then
compared with ``open_model``.  Big models (real shapes): written complete but sparse and loaded by
``llama-fit-params`` (a ``no_alloc`` load that reads no tensor data; its loader log needs
``-lv 5``), then compared the same way.  ``print_info`` prints per-layer values as one number when
all layers agree and as ``[a, b, ...]`` otherwise; ``file size`` is ``ml.n_bytes`` (the sum of
tensor bytes) as ``%.2f MiB`` below 1 GiB, else ``%.2f GiB``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.llama_log import LoadInfo, format_file_size, parse_load_info, per_layer_value
from tests.support.procs import ProcessFailed, free_port, run_to_completion, running_process

from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.roles import Role
from offload_planner.core.synth import BIG_MODELS, SMALL_MODELS, write_model

pytestmark = pytest.mark.integration

READY = r"llama_server: listening on http://127\.0\.0\.1:\d+"


def _uniform(v: int | list[int]) -> int | list[int]:
    return v[0] if isinstance(v, list) and v and all(x == v[0] for x in v) else v


def _serve(server: Path, model: Path, log_path: Path) -> str:
    """Start llama-server on a free port, wait for "listening", stop it; return its output."""
    last: ProcessFailed | None = None
    for _ in range(3):  # another process may grab the free port first
        args: list[str | Path] = [
            server, "-m", model, "--host", "127.0.0.1", "--port", str(free_port()),
            "-c", "512", "-np", "1", "--no-warmup", "-lv", "4", "-t", "2",
        ]  # fmt: skip
        try:
            with running_process(args, log_path=log_path, ready=READY, timeout=120) as proc:
                pass
            return proc.output()
        except ProcessFailed as e:
            last = e
            if "bind" not in e.output.lower():
                raise
    assert last is not None
    raise last


def _mismatches(model: Model, info: LoadInfo) -> list[str]:
    """Every hyper-parameter where llama.cpp's load log and our reader disagree."""
    s = model.summary
    out: list[str] = []

    def check(what: str, ours: object, theirs: object) -> None:
        if ours != theirs:
            out.append(f"{what}: reader {ours!r} != llama.cpp {theirs!r}")

    check("tensors", len(model.tensors), info.n_tensors)
    check("key-value pairs", len(model.metadata), info.n_kv)
    check("type counts", dict(s.type_counts), info.type_counts)
    check("file size", format_file_size(model.total_bytes), info.info["file size"].split(" (")[0])
    check("n_layer_all", s.n_layer, info.get_int("n_layer_all"))
    check("n_layer", s.n_layer_trunk, info.get_int("n_layer"))
    check("n_embd", s.n_embd, info.get_int("n_embd"))
    check("n_ctx_train", s.n_ctx_train, info.get_int("n_ctx_train"))
    check("n_vocab", s.n_vocab, info.get_int("n_vocab"))
    check("n_head", _uniform(s.n_head), per_layer_value(info.info["n_head"]))
    check("n_head_kv", _uniform(s.n_head_kv), per_layer_value(info.info["n_head_kv"]))
    check("n_ff", _uniform(s.n_ff), per_layer_value(info.info["n_ff"]))
    check("n_embd_head_k", s.head_dim_k, info.get_int("n_embd_head_k"))
    check("n_embd_head_v", s.head_dim_v, info.get_int("n_embd_head_v"))
    check("n_expert", s.n_expert, info.get_int("n_expert"))
    check("n_expert_used", s.n_expert_used, info.get_int("n_expert_used"))
    check("n_swa", s.n_swa, info.get_int("n_swa"))
    check("is_swa_any", int(s.has_swa), info.get_int("is_swa_any"))
    optional = {  # printed only for some architectures
        "n_layer_dense_lead": s.n_layer_dense_lead,
        "n_expert_shared": s.n_expert_shared,
        "n_ff_exp": s.n_ff_exp,
        "n_lora_q": s.q_lora_rank,
        "n_lora_kv": s.kv_lora_rank,
        "n_layer_nextn": s.n_nextn,
    }
    if s.is_mla:
        optional["n_embd_head_k_mla"] = s.key_length_mla
        optional["n_embd_head_v_mla"] = s.value_length_mla
    for key, ours in optional.items():
        if key in info.info:
            check(key, ours, info.get_int(key))
    nextn = {t.name: t.nbytes for t in model.tensors if t.role is Role.NEXTN}
    check("unused (NextN) tensors", nextn, info.unused_tensors)
    if info.layer_swa:  # -lv 5: "layer N assigned to device D, is_swa = B"
        theirs = [info.layer_swa.get(il) for il in range(s.n_layer)]
        check("per-layer SWA", list(s.swa_layers), theirs)
    return out


def _fit_params_info(bin_dir: Path, model: Path, n_layer: int, log_dir: Path) -> LoadInfo:
    """The loader log (-lv 5) of a ``no_alloc`` load by llama-fit-params, which reads no data.

    llama.cpp logs through a queue that is not drained at exit: when a tool ends right after
    logging, the tail of its log can be lost (seen under CPU load).  llama-fit-params drains it
    only when the fit succeeds; a model bigger than RAM ends in ``exit(1)`` ("failed to fit CLI
    arguments"), so the output is checked for completeness and the run repeated if needed.
    """
    args: list[str | Path] = [
        bin_dir / "llama-fit-params", "-m", model, "-c", "4096", "-nr", "-lv", "5", "-t", "2",
    ]  # fmt: skip
    text = ""
    for attempt in range(5):
        code, text = run_to_completion(args, log_path=log_dir / f"fit-{attempt}.log")
        assert "error loading model" not in text, text[-3000:]
        assert code in (0, 1), text[-3000:]  # 1: does not fit this machine's RAM
        try:
            info = parse_load_info(text)
        except ValueError:
            continue
        complete = (
            "n_vocab" in info.info
            and len(info.layer_swa) == n_layer + 1  # + the output layer
            and sum(info.type_counts.values()) == info.n_tensors
        )
        if complete:
            return info
    pytest.fail(f"llama-fit-params log incomplete in 5 runs:\n{text[-3000:]}")


@pytest.mark.parametrize("name", sorted(SMALL_MODELS))
def test_llama_server_loads_small_model_like_our_reader(
    name: str, small_models: dict[str, Path], llama_server: Path, tmp_path: Path
) -> None:
    text = _serve(llama_server, small_models[name], tmp_path / "server.log")
    info = parse_load_info(text)
    model = open_model(small_models[name])
    assert _mismatches(model, info) == []
    assert info.n_tensors == len(model.tensors)


def test_llama_server_loads_split_model(llama_server: Path, tmp_path: Path) -> None:
    paths = write_model(SMALL_MODELS["qwen3moe"], tmp_path / "qwen.gguf", split_max_tensors=20)
    assert len(paths) == 3
    text = _serve(llama_server, paths[0], tmp_path / "server.log")
    assert "additional 2 GGUFs metadata loaded" in text
    info = parse_load_info(text)
    model = open_model(paths[1])  # any shard opens the whole model
    assert len(model.shards) == 3
    assert _mismatches(model, info) == []


def test_split_is_byte_identical_to_llama_gguf_split(
    llama_bin_dir: Path, small_models: dict[str, Path], tmp_path: Path
) -> None:
    ours = write_model(SMALL_MODELS["llama"], tmp_path / "ours" / "m.gguf", split_max_tensors=16)
    (tmp_path / "theirs").mkdir()
    code, out = run_to_completion(
        [llama_bin_dir / "llama-gguf-split", "--split", "--split-max-tensors", "16",
         small_models["llama"], tmp_path / "theirs" / "m"],
        log_path=tmp_path / "split.log",
    )  # fmt: skip
    assert code == 0, out
    theirs = sorted((tmp_path / "theirs").glob("m-*.gguf"))
    assert [p.name for p in theirs] == [p.name for p in ours]
    for a, b in zip(ours, theirs, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


@pytest.mark.parametrize("name", sorted(SMALL_MODELS))
def test_llama_fit_params_sees_small_model_per_layer_like_our_reader(
    name: str, small_models: dict[str, Path], llama_bin_dir: Path, tmp_path: Path
) -> None:
    model = open_model(small_models[name])
    info = _fit_params_info(llama_bin_dir, small_models[name], model.summary.n_layer, tmp_path)
    assert _mismatches(model, info) == []


@pytest.mark.parametrize("name", sorted(BIG_MODELS))
def test_llama_cpp_accepts_big_model_shapes_like_our_reader(
    name: str, llama_bin_dir: Path, tmp_path: Path
) -> None:
    spec = BIG_MODELS[name]
    [full] = write_model(spec, tmp_path / f"{name}.gguf")  # sparse: header + a hole
    try:
        model = open_model(full)
        info = _fit_params_info(llama_bin_dir, full, spec.n_layer, tmp_path)
        assert _mismatches(model, info) == []
        # the header-only file (what the app ships) is the complete file's first bytes
        header = tmp_path / f"{name}.header.gguf"
        with full.open("rb") as f:
            header.write_bytes(f.read(model.shards[0].data_offset))
        head = open_model(header)
        assert head.header_only and not model.header_only
        assert head.total_bytes == model.total_bytes
        assert [t.name for t in head.tensors] == [t.name for t in model.tensors]
    finally:
        full.unlink(missing_ok=True)
