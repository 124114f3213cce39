"""Models llama.cpp refuses to load, refused before the planner computes with them.

``open_model`` reads any GGUF it can parse (``inspect`` shows what is there); a model to plan must
also pass what ``llama_model_base::load_hparams`` and the tensor loader check first (pinned build,
``src/llama-model.cpp``, ``src/llama-model-loader.cpp``; ik_llama.cpp's loader has the same keys and
asserts):

- ``<arch>.context_length``, ``<arch>.embedding_length`` and ``<arch>.block_count`` are read without
  a default: a file without one fails with "key not found in model: <key>";
- ``GGML_ASSERT(n_layer_all > 0)``, ``GGML_ASSERT(n_expert_used_max <= n_expert)`` and, with
  experts, ``GGML_ASSERT(n_expert_used_max > 0)`` abort the server;
- a tensor of a block past ``block_count`` is never created ("wrong number of tensors").

Without these checks such a file planned as if nothing were wrong, and the planner's own arithmetic
met the zeros: ``plan`` on a file without ``context_length`` never returned (micro-batches of 0
tokens), ``fit`` died with a ZeroDivisionError, one without ``block_count`` with an IndexError.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from offload_planner.core.errors import GGUFError
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.printable import printable

#: keys ``load_hparams`` reads without a default (for every architecture but a CLIP projector)
REQUIRED_KEYS = ("context_length", "embedding_length", "block_count")


def load_error(model: Model) -> GGUFError | None:
    """Why llama.cpp refuses to load ``model`` (the first reason, naming the file and the key or
    tensor), None when none of the checks above fails."""
    arch = printable(model.arch)  # the file's string, quoted in messages: no line break of its own
    if model.arch == "clip":
        return None
    where = model.shards[0].path if model.shards else model.path
    offsets = model.key_offsets
    for k in REQUIRED_KEYS:
        if f"{model.arch}.{k}" not in model.metadata:
            return GGUFError(where, f"key not found in model: {arch}.{k} (llama.cpp refuses to load a model "
                                    "without it)")
    s = model.summary
    key = f"{model.arch}.block_count"
    if s.n_layer == 0:
        return GGUFError(where, f"key {key!r}: 0 blocks: llama.cpp asserts at least one "
                                "(GGML_ASSERT n_layer_all > 0) and aborts", offsets.get(key))
    used = f"{model.arch}.expert_used_count"
    if s.n_expert_used > s.n_expert:
        return GGUFError(where, f"key {used!r}: {s.n_expert_used} experts used of {s.n_expert} "
                                f"({arch}.expert_count): llama.cpp asserts n_expert_used <= n_expert and "
                                "aborts", offsets.get(used))
    if s.n_expert and not s.n_expert_used:
        return GGUFError(where, f"key {used!r}: no expert used of {s.n_expert}: llama.cpp asserts at least "
                                "one (GGML_ASSERT n_expert_used_max > 0) and aborts",
                         offsets.get(used, offsets.get(f"{model.arch}.expert_count")))
    return _tensor_past_the_blocks(model, s.n_layer)


def _tensor_past_the_blocks(model: Model, n_layer: int) -> GGUFError | None:
    far = next((t for t in model.tensors if t.layer is not None and t.layer >= n_layer), None)
    if far is None:
        return None
    shard = model.shards[far.shard].path if far.shard < len(model.shards) else model.path
    return GGUFError(shard, f"tensor {far.name!r} is in block {far.layer}, but "
                            f"{printable(model.arch)}.block_count is {n_layer}: llama.cpp does not load it "
                            "and refuses the model (wrong number of tensors)")


def require_loadable(model: Model) -> Model:
    """``model`` itself, or the :class:`GGUFError` of :func:`load_error`."""
    err = load_error(model)
    if err is not None:
        raise err
    return model


def open_loadable(location: str | Path, *, progress: Callable[[int, int], None] | None = None) -> Model:
    """The model at ``location`` (a path or URL, any shard) opened the way llama.cpp loads it: read by
    :func:`~offload_planner.core.gguf_reader.open_model` (``progress`` as there), then refused with the
    :class:`GGUFError` of :func:`load_error` where llama.cpp would refuse it."""
    return require_loadable(open_model(location, progress=progress))


def context_error(model: Model, n_ctx: int | None) -> str | None:
    """``-c`` 0 or unset (``n_ctx``: 0 or None) on a model whose ``context_length`` is 0: llama.cpp
    takes the trained context for -c 0 and refuses ("n_ctx and model->hparams.n_ctx_train cannot both
    be zero", llama_init_from_model); the planner's micro-batches of 0 tokens never ended."""
    if n_ctx or model.summary.n_ctx_train:
        return None
    given = "no -c" if n_ctx is None else f"-c {n_ctx}"
    return (f"{given}: the model's trained context ({printable(model.arch)}.context_length in "
            f"{printable(str(model.path))}) is 0 and "
            "llama.cpp refuses a context of 0 ('n_ctx and model->hparams.n_ctx_train cannot both be zero'); "
            "give a context size, e.g. -c 4096")
