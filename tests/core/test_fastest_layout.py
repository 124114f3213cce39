"""The fastest plan's own fill chooses the layer split (-ts) with the experts (core/speed/layout.py).

On the cells of bench/fit_vs_baselines.py where llama.cpp's --fit (or the best --n-cpu-moe) beat the
fill for --goal tg, the answer is now the search's own plan: it fits every GPU with its margin by a
fresh projection of the engine, its placement is not any baseline's, and no baseline that fits is
faster in the estimate.  The block layout itself is checked against every layout of a small case
enumerated here, with the token time written out in the test."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from offload_planner.core.devices import DeviceSet, parse_device_decl
from offload_planner.core.gguf_reader import open_model
from offload_planner.core.model import Model
from offload_planner.core.placement import CPU
from offload_planner.core.speed.candidate import DEFAULT_MARGIN
from offload_planner.core.speed.fastest import fastest_plan
from offload_planner.core.speed.hardware import hardware_for
from offload_planner.core.speed.layout import LayerCost, Speeds, best_layout
from offload_planner.core.speed.ranking import score

RES = Path(__file__).resolve().parents[2] / "resources"
BASE = ["-c", "32768", "-t", "32"]  # the bench's command


def _big_devices(*gpus: str) -> DeviceSet:
    """The bench's host (8 channels of DDR5-4800, room for every expert) and GPUs."""
    return DeviceSet(parse_device_decl("CPU=768GiB,ram=8xDDR5-4800"),
                     tuple(parse_device_decl(f"CUDA{i}={g}") for i, g in enumerate(gpus)))


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Model]:
    from offload_planner.core.synth import BIG_MODELS, write_model

    out = {}
    for name in ("Qwen3-235B-A22B-Q4_K_M", "gpt-oss-120b-MXFP4"):
        [path] = write_model(BIG_MODELS[name], tmp_path_factory.mktemp("big") / f"{name}.gguf",
                             header_only=True)
        out[name] = open_model(str(path))
    return out


# the cells where the fill lost for --goal tg before (the answer was the baseline named)
LOST = [
    ("Qwen3-235B-A22B-Q4_K_M", ("rtx3090", "rtx3090")),  # llama.cpp --fit 22.74 against 22.51
    ("Qwen3-235B-A22B-Q4_K_M", ("a100-80gb-pcie",)),  # --n-cpu-moe 44 35.42 against 35.28
    ("Qwen3-235B-A22B-Q4_K_M", ("rtx3090",) * 4),  # llama.cpp --fit 31.53 against 30.89
    ("gpt-oss-120b-MXFP4", ("rtx3090", "rtx3090")),  # llama.cpp --fit 134.92 against 133.29
]


@pytest.mark.parametrize(("name", "gpus"), LOST)
def test_the_fill_beats_the_baselines_where_it_lost(big: dict[str, Model], name: str,
                                                    gpus: tuple[str, ...]) -> None:
    m = big[name]
    ds = _big_devices(*gpus)
    r = fastest_plan(m, ds, BASE, hardware_for(ds, threads=32), goal="tg")
    assert r.best is not None and r.best.verified
    assert r.best.label.startswith("fastest"), r.best.label  # the search's own plan, not a baseline
    fresh = r.best.plan.projection()  # the engine's, not the search's
    for g in ds.gpus:
        assert fresh.device(g.name).resident() + DEFAULT_MARGIN <= (g.capacity or 0), g.name
    mine = fresh.placement.tensor_devices()
    baselines = [c for c in r.candidates if not c.label.startswith("fastest")]
    assert {c.label for c in baselines} >= {"--cpu-moe", "llama.cpp --fit"}
    for c in baselines:
        assert c.plan.placement().tensor_devices() != mine or (
            c.plan.placement().unit_devices != fresh.placement.unit_devices), c.label
        if c.fits:
            assert score(r.best.estimate, "tg") >= score(c.estimate, "tg"), c.label
    fit = next(c for c in baselines if c.label == "llama.cpp --fit")
    assert r.best.estimate.tg_tps > fit.estimate.tg_tps


def _experts_off_their_layer(plan) -> int:  # type: ignore[no-untyped-def]
    """Layers with a routed expert on another device than the layer's attention."""
    p = plan.placement()
    return len({it.tensor.layer for it in p.items if it.tensor.role.is_routed_expert
                and it.device != p.layer_device(it.tensor.layer)})


def test_on_four_gpus_fewer_layers_leave_their_experts_than_with_the_split_by_memory(
        big: dict[str, Model]) -> None:
    """Qwen3-235B on four 24 GiB cards: with the split by free memory every GPU holds 24 layers and
    room for about 14 with their experts, so experts land off their layer; the layer split chosen
    with them keeps more layers whole than that and than llama.cpp's --fit."""
    ds = _big_devices(*("rtx3090",) * 4)
    r = fastest_plan(big["Qwen3-235B-A22B-Q4_K_M"], ds, BASE, hardware_for(ds, threads=32), goal="tg")
    assert r.best is not None and "own -ts" in r.best.label
    by_memory = next(c for c in r.candidates if c.label == "fastest (-ub 512)")
    fit = next(c for c in r.candidates if c.label == "llama.cpp --fit")
    ts = r.best.plan.placement_options.tensor_split
    assert len(ts) == 4 and sum(ts) == 95  # 94 layers and the output, per GPU
    off = _experts_off_their_layer(r.best.plan)
    assert off < _experts_off_their_layer(by_memory.plan)
    assert off <= _experts_off_their_layer(fit.plan)


@pytest.fixture(scope="module")
def qwen() -> Model:
    return open_model(str(RES / "Qwen3-30B-A3B-Q4_K_M.header.gguf"))


@pytest.mark.parametrize("pin", [["-ts", "1,1"], ["-ngl", "30"], ["-sm", "row"]])
def test_the_users_split_is_kept(qwen: Model, pin: list[str]) -> None:
    """-ts, a partial -ngl and -sm row are the user's: no candidate of the search changes the split."""
    ds = DeviceSet(parse_device_decl("CPU=256GiB,ram=4xDDR5-5600"),
                   (parse_device_decl("CUDA0=8GiB,bw=936GB/s"), parse_device_decl("CUDA1=8GiB,bw=936GB/s")))
    args = ["-c", "16384", *pin]
    r = fastest_plan(qwen, ds, args, hardware_for(ds, threads=16), goal="tg")
    ours = [c for c in r.candidates if c.label.startswith("fastest")]
    assert ours and not any("own -ts" in c.label for c in ours)
    split = ours[0].plan.base_placement().unit_devices
    assert all(c.plan.base_placement().unit_devices == split for c in ours)
    if pin[0] == "-ts":
        assert all(c.plan.placement_options.tensor_split == (1.0, 1.0) for c in ours)
    free = fastest_plan(qwen, ds, ["-c", "16384"], hardware_for(ds, threads=16), goal="tg")
    assert any("own -ts" in c.label for c in free.candidates)  # without the pin it may


def test_an_ot_rule_of_the_user_is_kept_with_a_chosen_split(qwen: Model) -> None:
    ds = DeviceSet(parse_device_decl("CPU=256GiB,ram=4xDDR5-5600"),
                   (parse_device_decl("CUDA0=8GiB,bw=936GB/s"), parse_device_decl("CUDA1=8GiB,bw=936GB/s")))
    r = fastest_plan(qwen, ds, ["-c", "16384", "-ot", r"blk\.(2|3)\.ffn_.*_exps=CPU"],
                     hardware_for(ds, threads=16), goal="tg")
    blocks = [c for c in r.candidates if "own -ts" in c.label]
    assert blocks
    for c in blocks:
        devs = c.plan.placement().tensor_devices()
        pinned = [t.name for t in qwen.tensors if t.layer in (2, 3) and t.role.is_routed_expert]
        assert {devs[n] for n in pinned} == {CPU}
        for g in ds.gpus:
            assert c.projection.device(g.name).resident() + DEFAULT_MARGIN <= (g.capacity or 0) or not c.fits


# --- the layout against every layout of a small case ------------------------------------------------


def _time(layers: list[LayerCost], units: tuple[int, ...], whole: set[int], sp: Speeds) -> float:
    """The straight-line token time: each layer's base at its GPU's speed, its experts at its GPU's
    or (with two splits) the CPU's, one split into every GPU after the first that holds a layer and
    into the last (the output)."""
    t, il, used = 0.0, 0, 0
    for g, n in enumerate(units):
        for lc in layers[il:il + n]:
            t += lc.base_tok * sp.gpu[g]
            if lc.experts and lc.index in whole:
                t += lc.experts_tok * sp.gpu[g]
            elif lc.experts:
                t += lc.experts_tok * sp.cpu + sp.detour[g]
        if n and used:
            t += sp.boundary
        used += n
        il += n
    if not units[-1]:
        t += sp.boundary
    return t


def _fits(layers: list[LayerCost], units: tuple[int, ...], whole: set[int], room: list[int]) -> bool:
    il = 0
    for g, n in enumerate(units):
        used = sum(lc.base + (lc.experts if lc.index in whole else 0) for lc in layers[il:il + n])
        if used > room[g]:
            return False
        il += n
    return True


def _brute(layers: list[LayerCost], room: list[int], sp: Speeds) -> float:
    n, k = len(layers), len(room)
    best = float("inf")
    for cuts in itertools.combinations_with_replacement(range(n + 1), k - 1):
        units = tuple(b - a for a, b in zip((0, *cuts), (*cuts, n), strict=True))
        for mask in range(1 << n):
            whole = {i for i in range(n) if mask >> i & 1 and layers[i].experts}
            if _fits(layers, units, whole, room):
                best = min(best, _time(layers, units, whole, sp))
    return best


ONE_KIND = [LayerCost(0, 2, 0, (), 5, 0)] + [LayerCost(i, 1, 3, (f"e{i}",), 5, 4) for i in range(1, 5)]
# two kinds: 2 bytes read 1 a token, 3 bytes read 6 (the larger saves more per byte)
TWO_KINDS = [LayerCost(0, 2, 0, (), 5, 0)] + [LayerCost(i, 1, 2 + i % 2, (f"e{i}",), 5, 1 + 5 * (i % 2))
                                              for i in (1, 2, 3, 4)]


@pytest.mark.parametrize(("layers", "room", "gpu"), [
    (ONE_KIND, [8, 8], (1.0, 1.0)),
    (ONE_KIND, [6, 6], (1.0, 1.0)),
    (ONE_KIND, [9, 4], (1.0, 6.0)),  # a fast card and a slow one: the slow one gets as little as it can
    (ONE_KIND, [4, 9, 5], (1.0, 3.0, 1.0)),
    (ONE_KIND, [20, 20], (1.0, 1.01)),  # all on the last card: no split to the output layer
    (TWO_KINDS, [6, 6], (1.0, 1.0)),
    (TWO_KINDS, [5, 7], (1.0, 1.0)),
    (TWO_KINDS, [8, 3], (1.0, 2.0)),
])
def test_the_layout_is_the_fastest_of_every_layout_that_fits(layers: list[LayerCost], room: list[int],
                                                             gpu: tuple[float, ...]) -> None:
    """A dense lead layer (2 bytes), then layers whose experts take 3 bytes and 4 a token (or the
    two kinds); the CPU reads 10x slower than the first card, two splits cost 3, one 0.5."""
    sp = Speeds(gpu, 10.0, tuple(3.0 for _ in gpu), 0.5)
    lay = best_layout(layers, room, sp)
    assert lay is not None
    units = (*lay.units[:-1], lay.units[-1] - 1)  # the output unit aside
    assert sum(units) == len(layers)
    assert _fits(layers, units, set(lay.whole), room)
    assert _time(layers, units, set(lay.whole), sp) == pytest.approx(_brute(layers, room, sp))


def test_no_layout_when_the_layers_alone_do_not_fit() -> None:
    layers = [LayerCost(i, 4, 3, (f"e{i}",), 1, 1) for i in range(3)]
    assert best_layout(layers, [5, 5], Speeds((1.0, 1.0), 10.0, (1.0, 1.0), 0.1)) is None


# --- -nkvo: only where the user allows it -----------------------------------------------------------


def test_the_kv_cache_goes_to_the_cpu_only_when_allowed(qwen: Model) -> None:
    """Qwen3-30B with a 131072-token f16 cache on one 8 GiB card: with every expert on the CPU the
    cache alone leaves the card over; with --allow-nkvo the search tries the cache on the CPU, whose
    plans fit the card by a fresh projection and carry -nkvo in their command."""
    from offload_planner.core.plan import plan_command

    ds = DeviceSet(parse_device_decl("CPU=256GiB,ram=4xDDR5-5600"),
                   (parse_device_decl("CUDA0=8GiB,bw=936GB/s"),))
    hw = hardware_for(ds, threads=16)
    kept = fastest_plan(qwen, ds, ["-c", "131072"], hw, goal="tg")
    ours = [c for c in kept.candidates if c.label.startswith("fastest")]
    assert all(c.plan.context.offload_kqv for c in ours) and not any(c.fits for c in ours)
    assert any("does not fit even with every routed expert on the CPU" in n for n in kept.notes)
    allowed = fastest_plan(qwen, ds, ["-c", "131072"], hw, goal="tg", allow_nkvo=True)
    nkvo = [c for c in allowed.candidates if c.label.startswith("fastest") and "-nkvo" in c.label]
    assert nkvo and all(not c.plan.context.offload_kqv for c in nkvo)
    c = next(c for c in nkvo if c.fits)
    fresh = c.plan.projection()
    assert fresh.device("CUDA0").resident() + DEFAULT_MARGIN <= 8 << 30
    assert not any(b.kind == "kv" for b in fresh.device("CUDA0").buffers)
    assert "-nkvo" in plan_command(c.plan)


def test_the_fastest_baseline_is_topped_up_with_single_experts(big: dict[str, Model]) -> None:
    """gpt-oss-120b on two 24 GiB cards: llama.cpp's --fit leaves room for single expert tensors;
    the search's copy of it keeps its split and every placement of its, moves only experts the fit
    left on the CPU onto a GPU, and fits each GPU by the engine's projection."""
    ds = _big_devices("rtx3090", "rtx3090")
    r = fastest_plan(big["gpt-oss-120b-MXFP4"], ds, BASE, hardware_for(ds, threads=32), goal="tg")
    fit = next(c for c in r.candidates if c.label == "llama.cpp --fit")
    seeded = next(c for c in r.candidates if c.label == "fastest (from llama.cpp --fit, split layers)")
    assert seeded.plan.placement_options == fit.plan.placement_options  # its -ts, -ngl and -ot rules
    before, after = fit.plan.placement().tensor_devices(), seeded.plan.placement().tensor_devices()
    changed = {n for n in before if before[n] != after[n]}
    assert changed and all(before[n] == CPU and after[n] != CPU and "_exps" in n for n in changed)
    fresh = seeded.plan.projection()
    for g in ds.gpus:
        assert fresh.device(g.name).resident() + DEFAULT_MARGIN <= (g.capacity or 0), g.name
    assert seeded.estimate.tg_tps > fit.estimate.tg_tps


# --- layers larger than a GPU's room after whole ones: parts of a layer's experts on its GPU -----------


@pytest.fixture(scope="module")
def kimi(tmp_path_factory: pytest.TempPathFactory) -> Model:
    """Kimi K2 as bench/fit_vs_baselines.py writes it (header only): DeepSeek-V3's shape with 384
    experts, 64 heads, one dense lead layer; its layers' routed experts take 8.9 or 10.2 GiB."""
    from dataclasses import replace

    from offload_planner.core.synth import BIG_MODELS, write_model

    ds3 = BIG_MODELS["DeepSeek-V3-Q4_K_M"]
    spec = replace(ds3, name="Kimi K2", n_head=64, n_expert=384, n_layer_dense_lead=1, n_ctx_train=131072,
                   rope_freq_base=50000.0, rope_scaling=replace(ds3.rope_scaling, factor=64.0),
                   tokenizer=replace(ds3.tokenizer, n_vocab=163840, pre="kimi-k2"),
                   extra_kv={**ds3.extra_kv, "expert_group_count": 1, "expert_group_used_count": 1})
    [path] = write_model(spec, tmp_path_factory.mktemp("kimi") / "Kimi-K2.gguf", header_only=True)
    return open_model(str(path))


def test_kimi_k2_on_four_cards_takes_parts_of_layers_into_the_room_whole_layers_leave(kimi: Model) -> None:
    """Kimi-K2 on four 24 GiB cards: a card holds two whole layers and ~2 GiB besides, less than one
    expert tensor (2.95 GiB), so the blocks of whole layers left room unused and the best plan was
    13.69 t/s.  The layout packed with parts (single expert tensors of a block's other layers on
    that block's GPU, or one larger layer for a smaller one) is the answer: faster than every other
    candidate that fits, its parts on their own layer's GPU with the rest of that layer's experts on
    the CPU, and it fits every GPU with its margin by a fresh projection of the engine."""
    ds = _big_devices(*("rtx3090",) * 4)
    r = fastest_plan(kimi, ds, BASE, hardware_for(ds, threads=32), goal="tg")
    assert r.best is not None and r.best.verified
    assert "own -ts, parts" in r.best.label, r.best.label
    assert r.best.estimate.tg_tps > 13.75  # 13.69 with whole layers only (and the older fills' 13.66)
    for c in r.candidates:
        if c.fits and c is not r.best:
            assert score(r.best.estimate, "tg") >= score(c.estimate, "tg"), c.label
    fresh = r.best.plan.projection()
    for g in ds.gpus:
        assert fresh.device(g.name).resident() + DEFAULT_MARGIN <= (g.capacity or 0), g.name
    p = fresh.placement
    devs: dict[int, set[str]] = {}
    for it in p.items:
        if it.tensor.role.is_routed_expert and it.device is not None:
            # no expert off its layer
            assert it.device in (CPU, p.layer_device(it.tensor.layer)), it.tensor.name
            devs.setdefault(it.tensor.layer or 0, set()).add(it.device)
    assert any(len(d) == 2 for d in devs.values())  # a layer with part of its experts on its GPU


def test_parts_fill_the_room_of_a_block() -> None:
    """One GPU, three layers whose experts are three tensors of 3 bytes each (9 a layer), room 16
    beside their bases: one whole layer (9) and two tensors of another (6) where whole layers alone
    leave 7 bytes unused; the parts saved time is what they read on the CPU, and they sit in the
    block's own layers.  The packed layout is never slower than the whole layers' by the same
    figures."""
    parts = ((3, 2), (3, 2), (3, 2))
    layers = [LayerCost(i, 1, 9, (f"g{i}", f"u{i}", f"d{i}"), 5, 6, parts) for i in range(3)]
    sp = Speeds((1.0,), 10.0, (3.0,), 0.5)
    whole = best_layout(layers, [19], sp)
    packed = best_layout(layers, [19], sp, 0)
    assert whole is not None and packed is not None
    assert len(whole.whole) == 1 and not whole.parts
    assert len(packed.whole) == 1 and len(packed.parts) == 2
    assert all(x[1:] not in {str(i) for i in packed.whole} for x in packed.parts)
    moves = packed.moves(layers, ["CUDA0"])
    assert len(moves) == 3 + 2 and set(moves.values()) == {"CUDA0"}
