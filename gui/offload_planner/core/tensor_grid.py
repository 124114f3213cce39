"""The tensor map as plain data: rows = layers (embeddings and output on their own rows), columns =
role groups, a cell = the placed tensors of that role in that layer.

Qt-free: :mod:`offload_planner.ui.tensor_map_model` is a thin adapter over a :class:`TensorGrid`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from offload_planner.core.byte_source import is_url
from offload_planner.core.draft_moves import DRAFT_PREFIX
from offload_planner.core.errors import PlannerError
from offload_planner.core.mmproj.placed import MMPROJ_RULE, NOT_MOVABLE, projector_block, projector_placed
from offload_planner.core.model import Model
from offload_planner.core.placement import Placed, Placement
from offload_planner.core.plan import Plan
from offload_planner.core.roles import Role


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    roles: frozenset[Role]
    description: str


#: Every column the map can show, in display order; a model shows those it has tensors for.
COLUMNS: tuple[Column, ...] = (
    Column(
        "embd",
        "embd/out",
        frozenset({Role.TOKEN_EMBD, Role.OUTPUT}),
        "token embeddings (input layer) and the output projection",
    ),
    Column("attn", "attn", frozenset({Role.ATTENTION}), "attention projections (q, k, v, o, MLA)"),
    Column("router", "router", frozenset({Role.ROUTER}), "expert router (ffn_gate_inp, exp_probs_b)"),
    Column("ffn", "dense", frozenset({Role.FFN_DENSE}), "dense feed-forward (leading dense layers)"),
    Column("shexp", "shared", frozenset({Role.SHARED_EXPERT}), "shared expert (ffn_*_shexp)"),
    Column(
        "exps_gate_up",
        "exp gate+up",
        frozenset({Role.EXPERTS_GATE_UP}),
        "routed experts, fused gate+up (ffn_gate_up_exps)",
    ),
    Column("exps_up", "exp up", frozenset({Role.EXPERTS_UP}), "routed experts, up (ffn_up_exps)"),
    Column("exps_gate", "exp gate", frozenset({Role.EXPERTS_GATE}), "routed experts, gate (ffn_gate_exps)"),
    Column("exps_down", "exp down", frozenset({Role.EXPERTS_DOWN}), "routed experts, down (ffn_down_exps)"),
    Column("ssm", "SSM", frozenset({Role.RECURRENT}), "recurrent / state-space tensors"),
    Column("nextn", "NextN", frozenset({Role.NEXTN}), "NextN / MTP block (multi-token prediction)"),
    Column(
        "norms",
        "norms",
        frozenset({Role.ATTN_NORM, Role.FFN_NORM, Role.OUTPUT_NORM}),
        "attention, FFN and output norms",
    ),
    Column("other", "other", frozenset({Role.OTHER, Role.ROPE}), "rope factors and unclassified tensors"),
)

_COLUMN_OF_ROLE: dict[Role, str] = {r: c.key for c in COLUMNS for r in c.roles}

#: Attention tensor kinds in display order when the attention column is split; others follow in
#: the order the model first has them.
ATTENTION_ORDER: tuple[str, ...] = (
    "attn_q", "attn_q_a", "attn_q_b", "attn_k", "attn_k_b", "attn_kv_a_mqa", "attn_kv_b", "attn_v",
    "attn_v_b", "attn_qkv", "attn_output", "attn_sinks",
)
_ATTENTION_LABELS = {"attn_output": "o", "attn_kv_a_mqa": "kv_a", "attn_qkv": "qkv"}
_KIND = re.compile(r"^(?:blk\.\d+\.)?([^.]+)")
SPLIT_PREFIX = "attn:"  # the key of a split attention column: "attn:attn_q"


def tensor_kind(name: str) -> str:
    """The tensor's kind from its name: ``blk.7.attn_q.weight`` → ``attn_q`` (weight and bias alike)."""
    m = _KIND.match(name)
    return m.group(1) if m else name


def attention_columns(model: Model) -> list[Column]:
    """One column per attention tensor kind the model has."""
    seen = dict.fromkeys(tensor_kind(t.name) for t in model.tensors if t.role is Role.ATTENTION)
    rank = {k: i for i, k in enumerate(ATTENTION_ORDER)}
    kinds = sorted(seen, key=lambda k: rank.get(k, len(rank)))  # stable: unknown kinds keep model order
    return [
        Column(
            SPLIT_PREFIX + k,
            _ATTENTION_LABELS.get(k, k.removeprefix("attn_")),
            frozenset({Role.ATTENTION}),
            f"attention: {k} (blk.N.{k}.*)",
        )
        for k in kinds
    ]


@dataclass(frozen=True)
class Row:
    key: str  # "embd", "blk.N", "output"
    label: str
    layer: int | None


@dataclass(frozen=True)
class CellItem:
    """One placed tensor as the map shows it."""

    placed: Placed
    moved: bool  # the user moved it away from the command's placement
    movable: bool
    reason: str  # why it is not movable

    @property
    def name(self) -> str:
        return self.placed.tensor.name

    @property
    def nbytes(self) -> int:
        return self.placed.tensor.nbytes

    @property
    def device(self) -> str | None:
        return self.placed.device


@dataclass(frozen=True)
class Cell:
    items: tuple[CellItem, ...]

    @cached_property
    def nbytes(self) -> int:
        return sum(i.nbytes for i in self.items)

    @cached_property
    def device_bytes(self) -> tuple[tuple[str | None, int], ...]:
        """Bytes per device in first-seen order (None = not loaded)."""
        out: dict[str | None, int] = {}
        for i in self.items:
            out[i.device] = out.get(i.device, 0) + i.nbytes
        return tuple(out.items())

    @property
    def moved(self) -> bool:
        return any(i.moved for i in self.items)

    @property
    def movable(self) -> bool:
        return any(i.movable for i in self.items)

    @property
    def not_movable_reason(self) -> str:
        return next((i.reason for i in self.items if not i.movable), "")

    @property
    def movable_names(self) -> list[str]:
        return [i.name for i in self.items if i.movable]


EMPTY = Cell(())


@dataclass
class TensorGrid:
    rows: list[Row]
    columns: list[Column]
    cells: dict[tuple[int, int], Cell] = field(default_factory=dict)

    def cell(self, row: int, col: int) -> Cell:
        return self.cells.get((row, col), EMPTY)

    @cached_property
    def column_max(self) -> list[int]:
        out = [0] * len(self.columns)
        for (_, c), cell in self.cells.items():
            out[c] = max(out[c], cell.nbytes)
        return out

    def column_index(self, key: str) -> int | None:
        return next((i for i, c in enumerate(self.columns) if c.key == key), None)

    def row_of_layer(self, layer: int) -> int | None:
        return next((i for i, r in enumerate(self.rows) if r.layer == layer), None)

    def names(self, positions: Iterable[tuple[int, int]], *, movable_only: bool = True) -> list[str]:
        out: list[str] = []
        for pos in positions:
            cell = self.cells.get(pos)
            if cell is not None:
                out += cell.movable_names if movable_only else [i.name for i in cell.items]
        return out

    def position_of(self, name: str) -> tuple[int, int] | None:
        for pos, cell in self.cells.items():
            if any(i.name == name and not i.placed.copy for i in cell.items):
                return pos
        return None


def is_projector(p: Placed) -> bool:
    return p.rule.startswith(MMPROJ_RULE)


def _projector_row_key(p: Placed) -> str:
    blk = projector_block(p.tensor.name)
    if blk is not None:
        return f"mm.blk.{blk}"
    return "mm.in" if p.tensor.name.startswith("v.") and "ln" not in p.tensor.name else "mm.out"


def with_projector(rows_columns: tuple[list[Row], list[Column]], items: Sequence[Placed]
                   ) -> tuple[list[Row], list[Column]]:
    """The map's rows and columns plus the projector's own rows (input, one per block, output)
    below the model's, and the columns its tensors need."""
    if not items:
        return rows_columns
    rows, columns = rows_columns
    keys = dict.fromkeys(_projector_row_key(p) for p in items)
    blocks = sorted(int(k.rsplit(".", 1)[1]) for k in keys if k.startswith("mm.blk."))
    extra = [Row("mm.in", "mm in", None)] if "mm.in" in keys else []
    extra += [Row(f"mm.blk.{b}", f"mm {b}", None) for b in blocks]
    extra += [Row("mm.out", "mm out", None)] if "mm.out" in keys else []
    present = {c.key for c in columns}
    need = {_COLUMN_OF_ROLE[p.tensor.role] for p in items} | {"other"}
    if any(c.key.startswith(SPLIT_PREFIX) for c in columns):
        need.discard("attn")  # split attention: the projector's attention goes to its kind's column
    new_columns = [c for c in COLUMNS if c.key in present | need]
    split = [c for c in columns if c.key.startswith(SPLIT_PREFIX)]
    if split:
        i = next(i for i, c in enumerate(new_columns) if c.key not in ("embd",))
        new_columns[i:i] = split
    return rows + extra, new_columns


def plan_projector_placed(plan: Plan) -> list[Placed]:
    """The tensors of the plan's --mmproj projector (none without one, or when it cannot be read:
    the analysis reports that error)."""
    setup = plan.mmproj()
    if setup is None or not plan.dialect.projects_mmproj:
        return []
    try:  # a URL is read by the projection, off the GUI thread; the map shows it once read
        return projector_placed(setup, plan.devices, read=not is_url(setup.location))
    except PlannerError:
        return []


def _row_key(p: Placed, n_layer: int) -> str:
    t = p.tensor
    if is_projector(p):
        return _projector_row_key(p)
    if t.layer is not None:
        return f"blk.{t.layer}"
    if p.copy:
        return "output"
    if t.role in (Role.TOKEN_EMBD, Role.ROPE):
        return "embd"
    return "output"


def layout(model: Model, *, split_attention: bool = False) -> tuple[list[Row], list[Column]]:
    """Rows and columns for a model: only the columns it has tensors for; with ``split_attention``
    the attention column becomes one column per attention tensor kind."""
    n_layer = model.summary.n_layer
    layers = sorted({t.layer for t in model.tensors if t.layer is not None} | set(range(n_layer)))
    rows = [Row("embd", "embd", None)]
    rows += [Row(f"blk.{il}", str(il), il) for il in layers]
    rows.append(Row("output", "out", None))
    present = {_COLUMN_OF_ROLE[t.role] for t in model.tensors}
    columns = [c for c in COLUMNS if c.key in present]
    if split_attention and "attn" in present:
        i = next(i for i, c in enumerate(columns) if c.key == "attn")
        columns[i : i + 1] = attention_columns(model)
    return rows, columns


def _column_key(p: Placed, col_idx: dict[str, int]) -> str:
    name = p.tensor.name.removeprefix("v.") if is_projector(p) else p.tensor.name
    if p.tensor.role is Role.ATTENTION:
        split = SPLIT_PREFIX + tensor_kind(name)
        if split in col_idx:
            return split
    key = _COLUMN_OF_ROLE[p.tensor.role]
    return key if key in col_idx or not is_projector(p) else "other"


def build_grid(
    model: Model,
    placement: Placement,
    base: Placement,
    movable: Sequence[tuple[str, tuple[bool, str]]] | None = None,
    rows_columns: tuple[list[Row], list[Column]] | None = None,
    projector: Sequence[Placed] = (),
) -> TensorGrid:
    """Group a placement into cells. ``base`` is the command's placement without the user's moves;
    ``movable`` gives (name, (movable, reason)) per tensor (default: everything movable);
    ``projector``: the --mmproj projector's tensors, in rows of their own, not movable."""
    rows, columns = with_projector(rows_columns or layout(model), projector)
    row_idx = {r.key: i for i, r in enumerate(rows)}
    col_idx = {c.key: i for i, c in enumerate(columns)}
    base_dev = {(p.tensor.name, p.copy): p.device for p in base.items}
    mov = dict(movable or ())
    buckets: dict[tuple[int, int], list[CellItem]] = {}
    for p in [*placement.items, *projector]:
        r = row_idx[_row_key(p, model.summary.n_layer)]
        c = col_idx[_column_key(p, col_idx)]
        if is_projector(p):
            ok, why = False, NOT_MOVABLE
        elif p.copy:
            ok, why = False, "the output copy of tied embeddings follows the output layer"
        elif p.device is None:
            ok, why = False, p.rule
        else:
            ok, why = mov.get(p.tensor.name, (True, ""))
        moved = not is_projector(p) and p.device != base_dev.get((p.tensor.name, p.copy))
        buckets.setdefault((r, c), []).append(CellItem(p, moved, ok, why))
    return TensorGrid(rows, columns, {k: Cell(tuple(v)) for k, v in buckets.items()})


DRAFT_FIXED = "the output copy of a draft model's tied embeddings follows its output layer"


def with_draft_rows(grid: TensorGrid, model: Model, placement: Placement) -> TensorGrid:
    """The grid with a speculative-decoding draft model's tensors as rows of their own below the main
    model's (same columns; a role the main model lacks adds its column).  Their names carry
    ``draft:`` (:mod:`core.draft_moves`): a move becomes an ``-otd`` rule."""
    keys = {c.key for c in grid.columns}
    present = {_COLUMN_OF_ROLE[t.role] for t in model.tensors}
    columns = list(grid.columns) + [c for c in COLUMNS if c.key in present and c.key not in keys]
    d_rows, _ = layout(model)
    rows = list(grid.rows) + [Row(DRAFT_PREFIX + r.key, f"draft {r.label}", None) for r in d_rows]
    row_idx = {r.key: i for i, r in enumerate(rows)}
    col_idx = {c.key: i for i, c in enumerate(columns)}
    buckets: dict[tuple[int, int], list[CellItem]] = {}
    for p in placement.items:
        pos = (row_idx[DRAFT_PREFIX + _row_key(p, model.summary.n_layer)], col_idx[_column_key(p, col_idx)])
        named = replace(p, tensor=replace(p.tensor, name=DRAFT_PREFIX + p.tensor.name))
        moved = p.rule.startswith("-otd ^")  # a rule the planner wrote for a move (core.draft_moves)
        buckets.setdefault(pos, []).append(CellItem(named, moved, not p.copy, DRAFT_FIXED if p.copy else ""))
    cells = dict(grid.cells)
    cells.update({k: Cell(tuple(v)) for k, v in buckets.items()})
    return TensorGrid(rows, columns, cells)
