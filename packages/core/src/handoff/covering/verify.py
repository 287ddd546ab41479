"""Covering arrays, the verifying half: a model of axes and constraints, the interactions its
allowed rows hold, and which of them a set of rows covers, misses, or covers first.

A model is data: axes (name -> values, in declared order), constraints (`Forbidden` partial
rows and `Implies` rules) and seed rows. A row is allowed when it breaks no constraint; an
interaction (t axis=value cells, t the strength) is required when some allowed row holds it, so
what the constraints rule out is never reported missing. `missing` names the required
interactions no row covers, at any strength, found without walking the product; `shortfall` checks a
selection against a promise; `trace` names the first row covering each required interaction.

Generation (greedy, search, lower bound) lives in `handoff.covering.generate`: it needs this
module, this one never needs it, and each stays one job at a readable length.

Every list returned here is in declared axis and value order (not sorted names, never a set's
order), so the first thing named is the same on every run and machine.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations, product

from handoff.errors import HandoffError

Row = Mapping[str, str]
Pair = tuple[tuple[str, str], tuple[str, str]]
#: t cells `(axis, value)` in axis order: a pair at strength 2, a triple at strength 3.
Interaction = tuple[tuple[str, str], ...]


def pairs_of(axes: Sequence[str], rows: Iterable[Row]) -> set[Pair]:
    """Every pair of (axis, value) that stands together in at least one of the rows."""
    return {((a, row[a]), (b, row[b])) for row in rows for a, b in combinations(axes, 2)}


def product_rows(axes: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    """The full Cartesian product of the axes, in axis and value order."""
    return [dict(zip(axes, values, strict=True)) for values in product(*axes.values())]


def format_interaction(cells: Interaction) -> str:
    """`policy=migration_enabled & fault=worker_failure`: how a pair (or triple) is named."""
    return " & ".join(f"{a}={v}" for a, v in cells)


def complete(
    rows: Sequence[Row],
    candidates: Sequence[Row],
    pair_axes: Sequence[str],
    value_axes: Sequence[str] = (),
    cells: Sequence[tuple[str, str]] = (),
) -> list[Row]:
    """Rows from `candidates` to add to `rows` until every pair over `pair_axes`, every value
    of `value_axes` and each of `cells` (axis, value) that the candidates hold is covered.

    Greedy and deterministic: each step takes the first candidate that covers the most of what
    is still missing. Used when a backend cannot run some published rows: the rest keep their
    ids, and the fewest extra rows this finds restore the promise.
    """

    def covers(row: Row) -> set[object]:
        values = {(a, row[a]) for a in value_axes} | {c for c in cells if row[c[0]] == c[1]}
        return pairs_of(pair_axes, [row]) | values

    need: set[object] = set().union(*(covers(c) for c in candidates)) if candidates else set()
    for row in rows:
        need -= covers(row)
    added: list[Row] = []
    while need:
        best = max(candidates, key=lambda c: len(covers(c) & need))
        added.append(best)
        need -= covers(best)
    return added


@dataclass(frozen=True)
class Forbidden:
    """No row may hold all of `cells` together: `Forbidden({"api": "chat", "plane": "tcp"})`."""

    cells: tuple[tuple[str, str], ...] | Mapping[str, str]
    why: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "cells", tuple(dict(self.cells).items()))

    def describe(self) -> str:
        return "forbidden " + " & ".join(f"{a}={v}" for a, v in dict(self.cells).items())


@dataclass(frozen=True)
class Implies:
    """A row with `axis`=`value` must hold one of `then` on `then_axis`:
    `Implies("topology", "decode", "response", ("stream",))`."""

    axis: str
    value: str
    then_axis: str
    then: tuple[str, ...]
    why: str = ""

    def describe(self) -> str:
        return f"{self.axis}={self.value} implies {self.then_axis} in {{{', '.join(self.then)}}}"


Constraint = Forbidden | Implies
#: A compiled constraint: its cells, and for an implication the implied axis and a bit mask of
#: the values it allows there.
_Rule = tuple[tuple[tuple[int, int], ...], tuple[int, int] | None]


def _outside(value: int | None, mask: int) -> bool:
    return value is not None and not mask >> value & 1


@dataclass(frozen=True)
class Model:
    """Axes (name -> values), constraints, and seed rows that a generated array starts with."""

    axes: Mapping[str, Sequence[str]]
    constraints: tuple[Constraint, ...] = ()
    seeds: tuple[Row, ...] = ()


class Space:
    """A model compiled to indices: axis i, value j. Checks rows and finds allowed rows.

    Raises HandoffError for a malformed model (an unknown axis or value, an empty axis, a seed
    that is incomplete or breaks a constraint) and for one whose constraints allow no row at
    all, naming a smallest set of constraints that together forbid every row.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self.names = tuple(model.axes)
        self.values = tuple(tuple(model.axes[a]) for a in self.names)
        self.levels = tuple(len(v) for v in self.values)
        self.index = [{v: j for j, v in enumerate(vs)} for vs in self.values]
        for name, vs, idx in zip(self.names, self.values, self.index, strict=True):
            if not vs or len(idx) != len(vs):
                raise HandoffError(f"axis {name!r} needs one or more distinct values, got {vs}")
        self.rules = [self._compile(c) for c in model.constraints]
        if self.find_row({}) is None:
            core = self.conflict()
            raise HandoffError(
                "the constraints allow no row at all; these together forbid every row: "
                + "; ".join(model.constraints[i].describe() for i in core)
            )
        self.seeds = [self.encode(s, f"seed row {n}") for n, s in enumerate(model.seeds)]
        for n, seed in enumerate(self.seeds):
            if (broken := self.broken(seed)) is not None:
                raise HandoffError(
                    f"seed row {n} ({format_interaction(self.decode(seed))}) breaks the "
                    f"constraint {model.constraints[broken].describe()}"
                )

    def axis(self, name: str, where: str) -> int:
        if name not in self.names:
            raise HandoffError(f"{where} names unknown axis {name!r}: use {', '.join(self.names)}")
        return self.names.index(name)

    def cell(self, axis: str, value: str, where: str) -> tuple[int, int]:
        i = self.axis(axis, where)
        if value not in self.index[i]:
            raise HandoffError(
                f"{where} names unknown {axis} {value!r}: use one of {', '.join(self.values[i])}"
            )
        return i, self.index[i][value]

    def _compile(self, rule: Constraint) -> _Rule:
        """A rule is broken by a row holding all its cells and, for an implication, a value
        outside the bit mask on the implied axis."""
        where = rule.describe()
        if isinstance(rule, Forbidden):
            if not rule.cells:
                raise HandoffError("a Forbidden constraint needs one or more axis=value cells")
            return tuple(self.cell(a, v, where) for a, v in rule.cells), None
        b, mask = self.axis(rule.then_axis, where), 0
        for v in rule.then:
            mask |= 1 << self.cell(rule.then_axis, v, where)[1]
        return (self.cell(rule.axis, rule.value, where),), (b, mask)

    def encode(self, row: Row, where: str) -> list[int]:
        """`row` as value indices, one per axis."""
        return [self.cell(a, _value(row, a, where), where)[1] for a in self.names]

    def encode_over(self, row: Row, where: str, over: Sequence[int]) -> list[int | None]:
        """`row` as value indices on the `over` axes only, None elsewhere."""
        cells: list[int | None] = [None] * len(self.names)
        for i in over:
            cells[i] = self.cell(self.names[i], _value(row, self.names[i], where), where)[1]
        return cells

    def decode(self, row: Sequence[int]) -> Interaction:
        return tuple((a, vs[j]) for a, vs, j in zip(self.names, self.values, row, strict=True))

    def row(self, row: Sequence[int]) -> dict[str, str]:
        return dict(self.decode(row))

    def broken(self, row: Sequence[int | None], rules: Iterable[int] | None = None) -> int | None:
        """The first constraint that the assigned cells of `row` (None: unassigned) break."""
        for i in range(len(self.rules)) if rules is None else rules:
            cells, then = self.rules[i]
            if all(row[a] == v for a, v in cells) and (
                then is None or _outside(row[then[0]], then[1])
            ):
                return i
        return None

    def find_row(
        self,
        fixed: Mapping[int, int],
        prefer: Sequence[int] | None = None,
        rules: Sequence[int] | None = None,
    ) -> list[int] | None:
        """An allowed row holding the `fixed` cells, or None. Depth-first over the free axes in
        order, each trying its `prefer` value first and then the rest in order."""
        active = list(range(len(self.rules)) if rules is None else rules)
        row: list[int | None] = [fixed.get(i) for i in range(len(self.names))]
        if self.broken(row, active) is not None:
            return None
        if not active:
            return [prefer[i] if v is None and prefer else v or 0 for i, v in enumerate(row)]
        free = [i for i, v in enumerate(row) if v is None]

        def fill(n: int) -> bool:
            if n == len(free):
                return True
            i = free[n]
            first = prefer[i] if prefer is not None else 0
            for v in (first, *(v for v in range(self.levels[i]) if v != first)):
                row[i] = v
                if self.broken(row, active) is None and fill(n + 1):
                    return True
            row[i] = None
            return False

        return [v or 0 for v in row] if fill(0) else None

    def allows(self, row: Sequence[int]) -> bool:
        """Whether a complete row breaks no constraint: `broken` without its generality, as
        the search asks this of every row it tries."""
        for cells, then in self.rules:
            if all(row[a] == v for a, v in cells) and (
                then is None or not then[1] >> row[then[0]] & 1
            ):
                return False
        return True

    def conflict(self) -> list[int]:
        """Constraints that together allow no row, none of them needless (without any one, some
        row is allowed): drop each in declared order while the rest still forbid every row."""
        core = list(range(len(self.rules)))
        for i in range(len(self.rules)):
            rest = [j for j in core if j != i]
            if self.find_row({}, rules=rest) is None:
                core = rest
        return core


class Interactions:
    """The t-way interactions of a space over some of its axes, numbered densely: the axis
    t-sets in order, and within one the values in mixed radix. `required` marks those some
    allowed row holds."""

    def __init__(self, space: Space, strength: int, over: Sequence[int] | None = None) -> None:
        cols = list(range(len(space.names)) if over is None else over)
        if not 1 <= strength <= len(cols):
            raise HandoffError(
                f"strength {strength} needs at least {strength} axes, and there are {len(cols)}"
                if strength > 0
                else f"strength must be 1 or more, not {strength}"
            )
        self.space, self.strength = space, strength
        self.combos = list(combinations(cols, strength))
        self.offsets, self.mults, total = [], [], 0
        for combo in self.combos:
            mults, m = [], 1
            for c in reversed(combo):
                mults.append(m)
                m *= space.levels[c]
            self.offsets.append(total)
            self.mults.append(tuple(reversed(mults)))
            total += m
        self.total = total
        self.required = self._required()

    def ids(self, row: Sequence[int]) -> list[int]:
        return [
            off + sum(row[c] * m for c, m in zip(combo, mults, strict=True))
            for combo, off, mults in zip(self.combos, self.offsets, self.mults, strict=True)
        ]

    def cells(self, ident: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The axes and values of interaction `ident`."""
        n = bisect_right(self.offsets, ident) - 1
        rest = ident - self.offsets[n]
        values = tuple(
            rest // m % self.space.levels[c]
            for c, m in zip(self.combos[n], self.mults[n], strict=True)
        )
        return self.combos[n], values

    def named(self, ident: int) -> Interaction:
        cols, values = self.cells(ident)
        s = self.space
        return tuple((s.names[c], s.values[c][v]) for c, v in zip(cols, values, strict=True))

    def _required(self) -> bytearray:
        if not self.space.rules:
            return bytearray(b"\x01") * self.total
        need = bytearray(self.total)
        for ident in range(self.total):
            if not need[ident]:
                row = self.space.find_row(dict(zip(*self.cells(ident), strict=True)))
                for i in self.ids(row) if row is not None else ():
                    need[i] = 1
        return need

    def covered(self, rows: Iterable[Sequence[int | None]]) -> list[int]:
        """For each interaction, the index of the first row that holds it, or -1."""
        first = [-1] * self.total
        for n, row in enumerate(rows):
            for combo, off, mults in zip(self.combos, self.offsets, self.mults, strict=True):
                cells = [row[c] for c in combo]
                if None in cells:
                    continue
                i = off + sum(v * m for v, m in zip(cells, mults, strict=True))
                if first[i] < 0:
                    first[i] = n
        return first


def _value(row: Row, axis: str, where: str) -> str:
    if axis not in row:
        raise HandoffError(f"{where} has no value for {axis}")
    return row[axis]


def _interactions(
    model: Model | Space, strength: int, over: Sequence[str] | None
) -> tuple[Interactions, list[int]]:
    space = model if isinstance(model, Space) else Space(model)
    if over is None:
        return Interactions(space, strength), list(range(len(space.names)))
    cols = sorted({space.axis(a, "the promise") for a in over})
    return Interactions(space, strength, cols), cols


def required(
    model: Model | Space, strength: int = 2, over: Sequence[str] | None = None
) -> list[Interaction]:
    """Every interaction of `strength` axes (among `over`, default all) an allowed row holds."""
    ix, _ = _interactions(model, strength, over)
    return [ix.named(i) for i in range(ix.total) if ix.required[i]]


def trace(
    model: Model | Space, rows: Sequence[Row], strength: int = 2, over: Sequence[str] | None = None
) -> list[tuple[Interaction, int | None]]:
    """Each required interaction with the index of the first of `rows` that covers it (None:
    none does), in axis and value order of its cells: where each promised pair comes from."""
    ix, cols = _interactions(model, strength, over)
    first = ix.covered(ix.space.encode_over(r, f"row {n}", cols) for n, r in enumerate(rows))
    # In the order `missing_pairs` uses: by the first cell's axis and value, then the next.
    rank = [sum(ix.space.levels[:c]) for c in range(len(ix.space.names))]
    order = sorted(
        (i for i in range(ix.total) if ix.required[i]),
        key=lambda i: [rank[c] + v for c, v in zip(*ix.cells(i), strict=True)],
    )
    return [(ix.named(i), first[i] if first[i] >= 0 else None) for i in order]


def missing(
    model: Model | Space, rows: Sequence[Row], strength: int = 2, over: Sequence[str] | None = None
) -> list[Interaction]:
    """The required interactions that no row covers, in declared axis and value order."""
    return [cells for cells, first in trace(model, rows, strength, over) if first is None]


@dataclass(frozen=True)
class Shortfall:
    """What a selection lacks of a promise: interactions (pairs) and single values."""

    interactions: tuple[Interaction, ...] = ()
    values: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.interactions or self.values)

    def lines(self) -> list[str]:
        """One line per missing pair or value: `api=chat & plane=tcp`, `fault=worker_failure`."""
        return [format_interaction(c) for c in self.interactions] + [
            f"{a}={v}" for a, v in self.values
        ]


def shortfall(
    model: Model,
    rows: Sequence[Row],
    pairs_over: Sequence[str] = (),
    each_value_of: Sequence[str] = (),
    cells: Sequence[tuple[str, str]] = (),
    strength: int = 2,
) -> Shortfall:
    """Check `rows` (hand-written or generated) against a promise: every allowed interaction
    over `pairs_over`, every allowed value of each axis of `each_value_of`, and each of `cells`
    (axis, value) that is allowed."""
    space = Space(model)
    pairs = missing(space, rows, strength, pairs_over) if len(pairs_over) >= strength else []
    values = [c for a in each_value_of for c in missing(space, rows, 1, [a])]
    axes = sorted({a for a, _ in cells})
    values += [c for a in axes for c in missing(space, rows, 1, [a]) if c[0] in cells]
    return Shortfall(tuple(pairs), tuple(c[0] for c in values))
