"""A layer's tensors placed at once, from an earlier placement of the model with the same home and the
same overrides (by what they resolve to) (``placement._PlaceOne.by_layer``), against placing each tensor.

A sequence of placements as the ``--fit`` search and a user write them (layer splits, -ngl below the
layer count, the search's overflow patterns, one layer's tensor elsewhere, -ot rules that resolve the
same at other indices, mmap on and off, MTP loaded) is placed with the memos warm and again with
them emptied before each (every layer then placed tensor by tensor): the same items (device, buffer
type, rule), override hits and units; the warm pass must take most layers at once, and an item
repeated hands out the same object (the replay and the weight buffers compare items by identity).
"""

from __future__ import annotations

from offload_planner.cli import demo_model_path
from offload_planner.core import placement as P
from offload_planner.core.devices import Device, DeviceKind, DeviceSet
from offload_planner.core.fit import PATTERN_MOE_ALL, overflow_pattern
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.placement import Override, Placement, PlacementOptions, place

GIB = 1 << 30


def _value(pl: Placement) -> tuple[object, ...]:
    return ([(p.tensor.name, p.device, p.buft, p.rule, p.copy) for p in pl.items], pl.unit_devices,
            pl.override_hits, pl.model_devices, pl.has_overrides, pl.rule_errors)


def _options(n: int) -> list[PlacementOptions]:
    moe_cpu = Override(PATTERN_MOE_ALL, "CPU", "--fit")
    out = [PlacementOptions(n_gpu_layers=n + 1), PlacementOptions(n_gpu_layers=n + 1, overrides=(moe_cpu,))]
    for low in (2, 6, 9):
        ot = tuple(Override(overflow_pattern(il, 4 if il > low else 2), "CPU", "--fit")
                   for il in range(low, n))
        out.append(PlacementOptions(n_gpu_layers=n + 1, tensor_split=(float(low), 0.0, 0.0, float(n - low)),
                                    overrides=ot))
        # the same rules one index further on: they resolve the same
        out.append(PlacementOptions(n_gpu_layers=n + 1, tensor_split=(float(low), 0.0, 0.0, float(n - low)),
                                    overrides=(Override(r"blk\.0\.nothing", "CPU"), *ot)))
    out += [PlacementOptions(n_gpu_layers=n - 5, tensor_split=(1.0, 2.0, 3.0, 4.0)),
            PlacementOptions(n_gpu_layers=n + 1,
                             overrides=(Override(r"blk\.30\.ffn_up_exps\.weight", "CUDA2"), moe_cpu)),
            PlacementOptions(n_gpu_layers=n + 1, overrides=(moe_cpu,), use_mmap=False),
            PlacementOptions(n_gpu_layers=n + 1, load_mtp=True),
            PlacementOptions(n_gpu_layers=n + 1, overrides=(moe_cpu,), plain_cpu_overrides=True)]
    return out


def test_layers_placed_at_once_equal_tensor_by_tensor() -> None:
    model = open_model(demo_model_path())
    devices = DeviceSet(Device("CPU", DeviceKind.CPU, 512 * GIB, 480 * GIB),
                        tuple(Device(f"CUDA{k}", DeviceKind.CUDA, 24 * GIB, 24 * GIB) for k in range(4)))
    opts = _options(model.summary.n_layer)
    warm = [place(model, devices, o) for o in opts]
    runs = P._runs_memo(P._item_memo(model.tensors))
    n_runs = len(runs)
    again = [place(model, devices, o) for o in opts]  # every run now in the memo
    assert len(runs) == n_runs
    # a run taken at once hands out the objects the tensor-by-tensor path did
    assert all(a is b for w, g in zip(warm, again, strict=True)
               for a, b in zip(w.items, g.items, strict=True))
    n_layer_runs = sum(1 for k0, k1 in P._layer_runs(model.tensors) if k1 - k0 > 1)
    assert n_runs < len(opts) * n_layer_runs * 3 // 5  # many layers were taken from an earlier placement
    for o, w in zip(opts, warm, strict=True):
        P._ITEMS.clear()
        P._RUN_ITEMS.clear()
        assert _value(place(model, devices, o)) == _value(w), o
