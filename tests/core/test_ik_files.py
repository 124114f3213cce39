"""Real ik_llama.cpp files: our reader against what ik itself reports when it loads them.

A session fixture writes a tiny llama model (F16/F32) with ``gguf.GGUFWriter``, quantizes it with
ik's ``llama-quantize`` to the ik types of ``IK_FTYPES`` and loads each result with ik's
``libllama`` (CPU, ``vocab_only = false``), keeping its log and ``llama_model_size`` /
``llama_model_n_params``. Quantized files are cached in pytest's cache dir (keyed by the ik build
and the generator), so only the first run pays for quantizing (about 25 s on 2 cores).

The ``gguf`` package's ``GGUFReader`` cannot open any of the ik files: it knows only mainline's
type ids and raises ``ValueError`` on the first ik id. That is why the planner has its own reader.
"""

from __future__ import annotations

import os
from collections import Counter
from itertools import pairwise
from pathlib import Path

import gguf
import pytest
from tests.support.ik_tools import (
    BUFFER_SIZE_LINE,
    IK_FTYPES,
    MAIN_GGML_TYPE,
    MODEL_PARAMS_LINE,
    MODEL_SIZE_LINE,
    SHARED_ONLY_FTYPES,
    IkFileSet,
    IkLoadReport,
    build_ik_files,
    ik_quantize_bin,
)

from offload_planner.core.ggml_types import Flavor
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.units import MiB

pytestmark = pytest.mark.integration


#: The types the planner must handle at the very least; each must quantize with this ik build.
REQUIRED_FTYPES = (
    "IQ4_KS", "IQ3_K", "IQ2_KS", "IQ4_K", "IQ5_KS", "IQ2_K", "Q6_0", "IQ4_KSS", "IQ3_KS",
    "IQ2_KL", "IQ4_KT",
)


@pytest.fixture(scope="session")
def ik_files(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> IkFileSet:
    if ik_quantize_bin() is None:
        msg = "ik-llama-cpp-python (bin/llama-quantize) is not installed"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    cache = getattr(request.config, "cache", None)
    root = (
        Path(cache.mkdir("offload_planner_ik_files")) if cache is not None
        else tmp_path_factory.mktemp("ik_files")
    )
    return build_ik_files(root)


def _file(ik_files: IkFileSet, ftype: str) -> tuple[Path, IkLoadReport]:
    res = ik_files.results[ftype]
    if res.path is None:
        if ftype not in ik_files.help_types:
            pytest.skip(f"this ik build's llama-quantize does not offer {ftype}")
        pytest.fail(f"ik's llama-quantize failed for {ftype}:\n{res.log[-3000:]}")
    return res.path, ik_files.reports[ftype]


def _model(ik_files: IkFileSet, ftype: str) -> tuple[Model, IkLoadReport]:
    path, report = _file(ik_files, ftype)
    return open_model(path), report


def test_required_types_are_offered_and_quantize(ik_files: IkFileSet) -> None:
    offered = [ft for ft in REQUIRED_FTYPES if ft in ik_files.help_types]
    assert offered == list(REQUIRED_FTYPES)
    failed = {ft: ik_files.results[ft].log[-500:] for ft in offered if not ik_files.results[ft].ok}
    assert failed == {}


@pytest.mark.parametrize("ftype", IK_FTYPES)
def test_ik_quantizes_and_loads(ik_files: IkFileSet, ftype: str) -> None:
    _, report = _file(ik_files, ftype)
    assert report.loaded, "\n".join(report.lines[-30:])
    assert report.model_size > 0
    assert ftype in report.desc  # e.g. "llama ?B IQ4_KS - 4.25 bpw"


@pytest.mark.parametrize("ftype", IK_FTYPES)
def test_type_counts_match_ik(ik_files: IkFileSet, ftype: str) -> None:
    model, report = _model(ik_files, ftype)
    ours = Counter(model.type_histogram())
    assert dict(ours) == report.type_counts()
    assert sum(ours.values()) == len(model.tensors) == model.shards[0].n_tensors
    main = MAIN_GGML_TYPE.get(ftype, ftype).lower()
    assert main in {name.lower() for name in ours}, f"{ftype} file has no {main} tensor"


@pytest.mark.parametrize("ftype", IK_FTYPES)
def test_total_bytes_and_params_match_ik(ik_files: IkFileSet, ftype: str) -> None:
    model, report = _model(ik_files, ftype)
    assert model.total_bytes == report.model_size  # llama_model_size = Σ ggml_nbytes
    assert sum(t.n_elements for t in model.tensors) == report.n_params


@pytest.mark.parametrize("ftype", IK_FTYPES)
def test_ik_log_lines_agree_with_our_numbers(ik_files: IkFileSet, ftype: str) -> None:
    """The size lines ik prints, reproduced from our totals with ik's formats."""
    model, report = _model(ik_files, ftype)
    total = model.total_bytes
    n_params = sum(t.n_elements for t in model.tensors)

    size = report.first_match(MODEL_SIZE_LINE)  # model size = %.3f MiB (%.3f BPW)
    assert size is not None, report.lines
    assert size.group(2) == "MiB"
    assert size.group(1) == f"{total / MiB:.3f}"
    assert size.group(3) == f"{total * 8 / n_params:.3f}"

    params = report.first_match(MODEL_PARAMS_LINE)  # model params = %.3f M
    assert params is not None and params.group(2) == "M"
    assert params.group(1) == f"{n_params / 1e6:.3f}"

    buf = report.first_match(BUFFER_SIZE_LINE)  # CPU buffer size = %8.2f MiB
    assert buf is not None and buf.group(1) == "CPU"
    span = model.shards[0].data_bytes
    assert buf.group(2) in {f"{total / MiB:.2f}", f"{span / MiB:.2f}"}


@pytest.mark.parametrize("ftype", IK_FTYPES)
def test_flavor(ik_files: IkFileSet, ftype: str) -> None:
    model, _ = _model(ik_files, ftype)
    if ftype in SHARED_ONLY_FTYPES:
        assert model.flavor is None
    else:
        assert model.flavor is Flavor.IK


@pytest.mark.parametrize("ftype", IK_FTYPES)
def test_gguf_package_reader(ik_files: IkFileSet, ftype: str) -> None:
    """gguf.GGUFReader fails on every file with an ik-only type id; it opens the controls."""
    path, _ = _file(ik_files, ftype)
    model = open_model(path)
    if ftype in SHARED_ONLY_FTYPES:
        r = gguf.GGUFReader(path)
        assert len(r.tensors) == len(model.tensors)
        assert r.data_offset == model.shards[0].data_offset
        assert sum(int(t.n_bytes) for t in r.tensors) == model.total_bytes
    else:
        with pytest.raises(ValueError, match="is not a valid GGMLQuantizationType"):
            gguf.GGUFReader(path)


@pytest.mark.parametrize("ftype", IK_FTYPES)
def test_file_size_is_header_plus_padded_tensors(ik_files: IkFileSet, ftype: str) -> None:
    path, _ = _file(ik_files, ftype)
    model = open_model(path)
    (shard,) = model.shards
    align = shard.alignment
    assert shard.file_size == path.stat().st_size
    assert not shard.header_only
    assert shard.data_offset % align == 0
    slack = shard.file_size - shard.data_offset - model.total_bytes
    assert 0 <= slack < align * len(model.tensors)
    # ik's writer pads every tensor, the last one included
    padded = sum(-(-t.nbytes // align) * align for t in model.tensors)
    assert shard.file_size == shard.data_offset + padded
    # tensors are laid out back to back in file order
    ends = sorted((t.offset, t.offset + t.nbytes) for t in model.tensors)
    assert ends[0][0] == shard.data_offset
    assert all(nxt[0] == -(-end // align) * align for (_, end), nxt in pairwise(ends))


def test_padding_is_exercised(ik_files: IkFileSet) -> None:
    """Files have tensors that need padding (259-row token_embd/output), so the layout test
    really checks the alignment handling; only 16-bit rows of 256 come out aligned anyway."""
    unpadded = []
    for ftype in IK_FTYPES:
        path = ik_files.path(ftype)
        if path is None:
            continue
        model = open_model(path)
        align = model.shards[0].alignment
        if not any(t.nbytes % align for t in model.tensors):
            unpadded.append(ftype)
    assert set(unpadded) <= {"BF16_R16"}
