"""Split GGUF models (``name-00001-of-00009.gguf`` with ``split.*`` keys), as llama.cpp's gguf-split
writes them: any shard finds its siblings, and the set is checked for completeness and consistency."""

from __future__ import annotations

import errno
import os
import re
from typing import TYPE_CHECKING

from offload_planner.core.byte_source import is_url
from offload_planner.core.errors import GGUFError

if TYPE_CHECKING:
    from offload_planner.core.gguf_reader import Header

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS = "split.tensors.count"
_SHARD_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_name(prefix: str, no: int, count: int) -> str:
    """llama.cpp's ``llama_split_path``: ``prefix-%05d-of-%05d.gguf`` with 1-based ``no``."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def _split_location(location: str) -> tuple[str, str]:
    """(base, name) of a path or URL, with any URL query kept on the name side."""
    if is_url(location):
        path, q, query = location.partition("?")
        base, _, name = path.rpartition("/")
        return base + "/", name + (q + query)
    return os.path.dirname(location), os.path.basename(location)


def shard_locations(location: str, first: Header) -> list[str]:
    """All shard locations of the model ``location`` belongs to (just itself if not split)."""
    count = first.metadata.get(SPLIT_COUNT)
    if not isinstance(count, int) or count <= 1:
        return [location]
    base, name = _split_location(location)
    name_only, q, query = name.partition("?")
    m = _SHARD_RE.match(name_only)
    if m is None:
        raise GGUFError(
            location,
            f"part of a {count}-file split model, but the name does not follow "
            "the NAME-00001-of-0000N.gguf pattern, so the other parts cannot be found",
        )
    if int(m["count"]) != count:
        raise GGUFError(
            location, f"file name says {int(m['count'])} parts but split.count says {count}"
        )
    out = []
    for no in range(1, count + 1):
        fname = shard_name(m["prefix"], no, count) + q + query
        out.append(base + fname if is_url(location) else os.path.join(base, fname))
    if not is_url(location):
        missing = [p for p in out if not os.path.exists(p)]
        if missing:
            raise GGUFError(
                missing[0],
                f"missing part {out.index(missing[0]) + 1} of {count} of split model "
                f"(opened {os.path.basename(location)})" + _dangling(missing[0])
                + (f"; {len(missing) - 1} more parts missing" if len(missing) > 1 else ""),
            )
    return out


def _dangling(path: str) -> str:
    """Why a part that ``ls`` lists is missing: a symbolic link (a Hugging Face cache's snapshot links
    to its blobs) whose target does not exist or that loops; "" for a part that is not there."""
    if not os.path.islink(path):
        return ""
    try:
        target = os.readlink(path)
    except OSError:
        return ": a symbolic link that cannot be read"
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f": a symbolic link that loops ({path} -> {target})"
    return f": a symbolic link to {target}, which does not exist (an interrupted download?)"


def check_shards(headers: list[Header]) -> None:
    """Each shard must say it is part i of the same count, and tensor counts must add up."""
    if len(headers) == 1:
        return
    count = len(headers)
    total = headers[0].metadata.get(SPLIT_TENSORS)
    for i, h in enumerate(headers):
        no = h.metadata.get(SPLIT_NO)
        if no != i:
            raise GGUFError(h.path, f"split.no is {no!r}, expected {i} for part {i + 1}")
        if h.metadata.get(SPLIT_COUNT) != count:
            raise GGUFError(
                h.path, f"split.count is {h.metadata.get(SPLIT_COUNT)!r}, other parts say {count}"
            )
    have = sum(len(h.tensors) for h in headers)
    if isinstance(total, int) and have != total:
        raise GGUFError(
            headers[0].path, f"split.tensors.count is {total} but the {count} parts hold {have}"
        )
