"""Which placement items differ from a recorded list, found once per projection.

Several parts of a projection keep the item list of a placement they computed in full (the replay's
references of the prompt and one-token graphs, the weight buffers, the compute memo's key) and
correct it for a later placement that differs in a few items, found by identity (``Placed`` is
frozen).  On a big model (~700 items) each such scan costs about 30 us, and a move's projection made
four of them against copies of the same list.  Here a recorded list is kept as one copy per list
it was taken from (:func:`kept_copy`: the parts recorded from the same placement share it), and the
changed indices of a list against a kept copy are remembered for the last few pairs
(:func:`changed_items`): the first part of a projection scans, the others look it up; a placement
whose maker knows its changes notes them (:func:`note_changed`) and none scans.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from itertools import compress, count
from operator import is_not
from typing import Any

_SIZE = 8
#: id(list) -> (the list, its kept copy): both kept alive while here, so an id is not reused meanwhile
_COPIES: OrderedDict[int, tuple[Sequence[Any], list[Any]]] = OrderedDict()
#: (id(items), id(kept copy)) -> (items, kept copy, changed indices)
_CHANGED: OrderedDict[tuple[int, int], tuple[Sequence[Any], Sequence[Any], list[int]]] = OrderedDict()
_LOCK = threading.Lock()  # the window projects on its GUI thread and a worker


def kept_copy(items: Sequence[Any]) -> list[Any]:
    """A copy of ``items`` to keep as a recorded list (never changed), the same one for every part
    that records from the same list object."""
    with _LOCK:
        got = _COPIES.get(id(items))
        if got is not None and got[0] is items and len(got[1]) == len(items):
            _COPIES.move_to_end(id(items))
            return got[1]
        copy = list(items)
        _COPIES[id(items)] = (items, copy)
        if len(_COPIES) > _SIZE:
            _COPIES.popitem(last=False)
        return copy


def changed_items(items: Sequence[Any], kept: Sequence[Any]) -> list[int]:
    """Indices where ``items`` holds another object than the recorded ``kept`` (same length)."""
    key = (id(items), id(kept))
    with _LOCK:
        got = _CHANGED.get(key)
        if got is not None and got[0] is items and got[1] is kept:
            return got[2]
    changed = list(compress(count(), map(is_not, items, kept)))
    with _LOCK:
        _CHANGED[key] = (items, kept, changed)
        if len(_CHANGED) > _SIZE:
            _CHANGED.popitem(last=False)
    return changed


def note_changed(items: Sequence[Any], source: Sequence[Any], changed: list[int]) -> None:
    """``items`` holds another object than the list ``source`` exactly at ``changed`` (ascending):
    its maker knows (``Plan.placement`` replaces the moved tensors' items of the base placement's
    list), so no part of the projection scans for them where ``source`` is the list it recorded."""
    with _LOCK:
        got = _COPIES.get(id(source))
        if got is None or got[0] is not source or len(items) != len(source):
            return
        _CHANGED[(id(items), id(got[1]))] = (items, got[1], changed)
        if len(_CHANGED) > _SIZE:
            _CHANGED.popitem(last=False)
