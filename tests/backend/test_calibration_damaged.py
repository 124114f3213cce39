"""calibration.json as a hand edit or another version leaves it: recording a launch's compute buffers
raised on an entry of the wrong shape (AttributeError, ValueError, OverflowError: after the server had
loaded, in ``launch --save-calibration`` and the window's Launch tab), and a file that did not read was
written over, losing every calibration in it without a word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offload_planner.backend.calibration import MAX_ENTRIES, VERSION, CalibrationStore


def _store(path: Path, entries: object) -> CalibrationStore:
    path.write_text(json.dumps({"version": VERSION, "entries": entries}), encoding="utf-8")
    return CalibrationStore(path)


@pytest.mark.parametrize("entry", ["junk", {"runs": "x"}, {"runs": 1e300}, {"runs": -4}, {"runs": True}, []])
def test_a_hand_edited_entry_counts_as_no_run(tmp_path: Path, entry: object) -> None:
    store = _store(tmp_path / "calibration.json", {"fp/opt": entry})
    cal = store.record("fp", "opt", {"CUDA0": 1}, {"CUDA0": 2})
    assert cal.runs == 1 and store.note == ""
    assert store.lookup("fp", "opt") == cal


def test_entries_with_odd_times_are_dropped_first(tmp_path: Path) -> None:
    entries: dict[str, object] = {f"fp{i}/opt": {"when": float(i + 1)} for i in range(MAX_ENTRIES)}
    entries["bad/opt"] = {"when": "soon"}
    entries["junk/opt"] = "junk"
    store = _store(tmp_path / "calibration.json", entries)
    store.record("new", "opt", {"CUDA0": 1}, {"CUDA0": 2})
    kept = json.loads((tmp_path / "calibration.json").read_text())["entries"]
    assert len(kept) == MAX_ENTRIES and "new/opt" in kept
    assert "bad/opt" not in kept and "junk/opt" not in kept and "fp0/opt" not in kept


@pytest.mark.parametrize("raw", [b'{"version": 1, "entries": {"a/b": {}},}', b"\xff\xfe", b'{"version": 99}',
                                 b'{"version": 1, "entries": []}'])
def test_a_store_that_does_not_read_is_kept_aside_and_named(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "calibration.json"
    path.write_bytes(raw)
    store = CalibrationStore(path)
    store.record("fp", "opt", {"CUDA0": 1}, {"CUDA0": 2})
    assert (tmp_path / "calibration.json.damaged").read_bytes() == raw
    assert store.note.startswith(f"{path} could not be read (") and store.note.endswith(
        f"kept as {tmp_path / 'calibration.json.damaged'}")
    assert store.lookup("fp", "opt") is not None
    store.record("fp", "opt2", {"CUDA0": 1}, {"CUDA0": 2})
    assert store.note == ""  # readable now: written over quietly
