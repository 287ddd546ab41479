"""Covering arrays, the generating half: the smallest array this finds for a model.

Strength t is 2 by default, 3 on request (1 works too). `Space` (in `handoff.covering.verify`) gives
the allowed rows and the required interactions, so constraints shape everything below.

- `lower_bound`: the most required interactions on any one set of t axes (each row covers
  exactly one of them; without constraints, the product of the t largest level counts), at
  least the number of seed rows, and at strength 2 the Kleitman-Spencer/Katona bound (smallest
  N with C(N-1, ceil(N/2)) >= k) over k axes whose allowed values all pair freely.
- `greedy`: AETG-like; each row grows from an uncovered interaction, one axis at a time, each
  taking the allowed value that completes the most uncovered interactions; the best of a few
  such rows is kept. It is the upper bound and the fallback.
- `cover`: a tabu search after Nurmela (2004) over N x k arrays of allowed rows, seed rows
  held fixed: try N = the lower bound (on small models that is often the optimum, and then it
  is proved), and if that fails, walk down from the greedy size one row at a time until a
  size fails. A local search, not an exhaustive one: a failed size is not proved impossible.

No algebraic construction is used, so nothing is keyed to particular level counts: every array
comes from the greedy generator or the search.

Determinism: the same model and strength give the same rows, in the same order, on every run,
machine and Python version. Iteration follows declared axis, value and constraint order or
the dense interaction numbering, never the order of a set or dict; the only randomness is a
splitmix64 generator (not `random`) started from the fixed `SEED`; the search stops after a
fixed number of moves, never on a clock; the rows come out seeds first, the rest sorted.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, comb

from handoff.covering.verify import Interactions, Model, Space
from handoff.errors import HandoffError

SEED = 0x5EED_C0FE
#: Moves the tabu search may make at one array size; the time a search takes is bounded by it.
MOVES = 6000
#: Candidate rows the greedy generator grows before it keeps the one covering most.
TRIES = 8
_MASK = (1 << 64) - 1


class _Rng:
    """splitmix64: tiny, fixed, and the same on every machine and Python."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def below(self, n: int) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return ((z ^ (z >> 31)) * n) >> 64


@dataclass(frozen=True)
class Cover:
    """A generated covering array and the lower bound it is measured against."""

    rows: tuple[dict[str, str], ...]
    lower_bound: int

    @property
    def proved_optimal(self) -> bool:
        return len(self.rows) == self.lower_bound


def cover(model: Model, strength: int = 2, moves: int = MOVES) -> Cover:
    """The smallest covering array of `strength` (1 to 3) that this finds for `model`, with
    the lower bound: seed rows first, in order, then the rest in value order. Every required
    interaction is covered and every row is allowed. `moves` bounds the search at each size
    (and so its time); fewer moves may leave a larger array, never a wrong one."""
    space, ix = _prepare(model, strength)
    fixed = len(space.seeds)
    rows = _smallest(ix, moves)
    ordered = rows[:fixed] + sorted(rows[fixed:])
    return Cover(tuple(space.row(r) for r in ordered), _lower_bound(ix))


def generate(model: Model, strength: int = 2, moves: int = MOVES) -> list[dict[str, str]]:
    """`cover(model, strength).rows`, as a list."""
    return list(cover(model, strength, moves).rows)


def lower_bound(model: Model, strength: int = 2) -> int:
    """No covering array of `strength` for `model` (seed rows included) has fewer rows."""
    return _lower_bound(Interactions(Space(model), strength))


def greedy(model: Model, strength: int = 2) -> list[dict[str, str]]:
    """The greedy array alone (the upper bound `cover` starts from): seed rows first."""
    space, ix = _prepare(model, strength)
    return [space.row(r) for r in _greedy(ix, _Rng(SEED))]


def _prepare(model: Model, strength: int) -> tuple[Space, Interactions]:
    if not 1 <= strength <= 3:
        raise HandoffError(f"covering arrays are generated at strength 1 to 3, not {strength}")
    space = Space(model)
    return space, Interactions(space, strength)


def _lower_bound(ix: Interactions) -> int:
    """The most required interactions on any one set of t axes (each row covers one of them),
    the seed rows, and for strength 2 the binary bound over the axes `_free_axes` finds."""
    ends = [*ix.offsets[1:], ix.total]
    bound = max(sum(ix.required[a:b]) for a, b in zip(ix.offsets, ends, strict=True))
    bound = max(bound, len(ix.space.seeds))
    return max(bound, _katona(_free_axes(ix))) if ix.strength == 2 else bound


def _katona(k: int) -> int:
    """Kleitman-Spencer and Katona: a binary strength-2 array over k >= 2 axes needs the
    smallest N with C(N-1, ceil(N/2)) >= k rows, and that many suffice."""
    if k < 2:
        return 0
    n = 4
    while comb(n - 1, ceil(n / 2)) < k:
        n += 1
    return n


def _free_axes(pairs: Interactions) -> int:
    """How many axes, each with two or more allowed values, have every pair of their allowed
    values required (a clique of such axes, grown greedily in axis order). Merging each one's
    values into two classes turns an array over them into a binary one, so `_katona` holds."""
    space, need = pairs.space, pairs.required
    k, levels = len(space.names), space.levels
    seen = [[False] * n for n in levels]
    count = [[0] * k for _ in range(k)]
    for (a, b), off in zip(pairs.combos, pairs.offsets, strict=True):
        for i in range(levels[a] * levels[b]):
            if need[off + i]:
                seen[a][i // levels[b]] = seen[b][i % levels[b]] = True
                count[a][b] += 1
    allowed = [sum(s) for s in seen]
    clique: list[int] = []
    for c in range(k):
        if allowed[c] >= 2 and all(count[a][c] == allowed[a] * allowed[c] for a in clique):
            clique.append(c)
    return len(clique)


def _shuffled(items: list[int], rng: _Rng) -> list[int]:
    items = list(items)
    for i in range(len(items) - 1, 0, -1):
        j = rng.below(i + 1)
        items[i], items[j] = items[j], items[i]
    return items


def _terms(ix: Interactions) -> list[tuple[int, int, int, int, int, int, int]]:
    """Each axis set as `off, a, ma, b, mb, c, mc`: id = off + row[a]*ma + row[b]*mb +
    row[c]*mc, padded with zero multipliers below strength 3."""
    out = []
    for combo, off, mults in zip(ix.combos, ix.offsets, ix.mults, strict=True):
        cells = list(zip(combo, mults, strict=True)) + [(combo[0], 0)] * (3 - len(combo))
        (a, ma), (b, mb), (c, mc) = cells
        out.append((off, a, ma, b, mb, c, mc))
    return out


def _greedy(ix: Interactions, rng: _Rng, tries: int = TRIES) -> list[list[int]]:
    space = ix.space
    k, terms = len(space.names), _terms(ix)
    by_axis = [
        [t for t, combo in zip(terms, ix.combos, strict=True) if c in combo] for c in range(k)
    ]
    left = bytearray(ix.required)
    rows: list[list[int]] = []

    def keep(row: list[int]) -> None:
        rows.append(row)
        for i in ix.ids(row):
            left[i] = 0

    for seed in space.seeds:
        keep(list(seed))
    while open_ := [i for i in range(ix.total) if left[i]]:
        best: list[int] = []
        most = -1
        for trial in range(tries):
            cols, vals = ix.cells(open_[0] if trial == 0 else open_[rng.below(len(open_))])
            row = _grow(ix, by_axis, left, dict(zip(cols, vals, strict=True)), rng, trial)
            gain = sum(left[i] for i in ix.ids(row))
            if gain > most:
                best, most = row, gain
        keep(best)
    return rows


def _grow(
    ix: Interactions,
    by_axis: list[list[tuple[int, int, int, int, int, int, int]]],
    left: bytearray,
    fixed: dict[int, int],
    rng: _Rng,
    trial: int,
) -> list[int]:
    """A row holding the `fixed` cells, the other axes set one at a time (in axis order on the
    first trial, shuffled after) to the allowed value completing most uncovered interactions
    with the axes already set."""
    space = ix.space
    row = [fixed.get(c, 0) for c in range(len(space.names))]
    done = [c in fixed for c in range(len(space.names))]
    order = [c for c in range(len(space.names)) if not done[c]]
    for c in _shuffled(order, rng) if trial else order:
        done[c] = True
        choice, most = 0, -1
        for v in range(space.levels[c]):
            fixed[c] = v
            if space.rules and space.find_row(fixed) is None:
                continue
            row[c] = v
            gain = sum(
                left[off + row[a] * ma + row[b] * mb + row[d] * md]
                for off, a, ma, b, mb, d, md in by_axis[c]
                if done[a] and done[b] and done[d]
            )
            if gain > most:
                choice, most = v, gain
        row[c] = fixed[c] = choice
    return row


def _tabu(
    ix: Interactions, start: list[list[int]], fixed: int, rng: _Rng, moves: int
) -> list[list[int]] | None:
    """Nurmela-style tabu search: take a random uncovered interaction, and of the rows that
    could be changed to cover it, change the one that leaves the fewest uncovered (a row whose
    changed cells were changed within the last few moves only if that beats the best yet).
    A changed row that breaks a constraint is repaired: the nearest allowed row (first found
    keeping its other cells) holding the interaction. None if `moves` run out."""
    search = _Search(ix, start)
    tenure, best = 1 + len(search.rows) // 4, len(search.open_)
    for move in range(moves):
        if not search.open_:
            return search.rows
        tau = search.open_[rng.below(len(search.open_))]
        options = search.options(tau, fixed, move, best)
        if not options:
            continue
        r, new, changed = options[rng.below(len(options))] if len(options) > 1 else options[0]
        search.change(r, new, changed)
        for c in changed:
            search.until[r][c] = move + tenure
        best = min(best, len(search.open_))
    return search.rows if not search.open_ else None


class _Search:
    """The tabu search's state: the rows, how often each interaction is covered, the uncovered
    ones (`open_`, with each one's place in it), and until which move each cell is tabu."""

    def __init__(self, ix: Interactions, start: list[list[int]]) -> None:
        self.ix, self.space = ix, ix.space
        self.k, self.terms = len(ix.space.names), _terms(ix)
        self.rows = [list(r) for r in start]
        self.count = [0] * ix.total
        for r in self.rows:
            for i in ix.ids(r):
                self.count[i] += 1
        self.where = [-1] * ix.total
        self.open_: list[int] = []
        for i in range(ix.total):
            if ix.required[i] and not self.count[i]:
                self.where[i] = len(self.open_)
                self.open_.append(i)
        self.touched: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self.cells: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.until = [[-1] * self.k for _ in self.rows]

    def options(
        self, tau: int, fixed: int, move: int, best: int
    ) -> list[tuple[int, list[int], tuple[int, ...]]]:
        """The rows (from `fixed` on) whose change to cover `tau` leaves the fewest uncovered,
        each with its new cells and which changed; tabu ones only where they beat `best`."""
        if tau not in self.cells:
            self.cells[tau] = self.ix.cells(tau)
        cols, vals = self.cells[tau]
        count, least, options = self.count, 0, []
        for r in range(fixed, len(self.rows)):
            old = self.rows[r]
            new = old.copy()
            for c, v in zip(cols, vals, strict=True):
                new[c] = v
            if self.space.rules and not self.space.allows(new):
                repaired = self.space.find_row(dict(zip(cols, vals, strict=True)), prefer=old)
                if repaired is None:
                    continue
                new = repaired
            changed = tuple(c for c in range(self.k) if new[c] != old[c])
            delta = 0
            for off, a, ma, b, mb, c, mc in self._touched(changed):
                if count[off + old[a] * ma + old[b] * mb + old[c] * mc] == 1:
                    delta += 1
                if not count[off + new[a] * ma + new[b] * mb + new[c] * mc]:
                    delta -= 1
            tabu = any(self.until[r][c] > move for c in changed)
            if tabu and len(self.open_) + delta >= best:
                continue
            if not options or delta < least:
                least, options = delta, [(r, new, changed)]
            elif delta == least:
                options.append((r, new, changed))
        return options

    def _touched(self, changed: tuple[int, ...]) -> list[tuple[int, ...]]:
        if changed not in self.touched:
            self.touched[changed] = [
                t for t in self.terms if t[1] in changed or t[3] in changed or t[5] in changed
            ]
        return self.touched[changed]

    def change(self, r: int, new: list[int], changed: tuple[int, ...]) -> None:
        """Row `r` becomes `new`: the counts and the uncovered follow."""
        old, count, where, open_ = self.rows[r], self.count, self.where, self.open_
        for off, a, ma, b, mb, c, mc in self._touched(changed):
            i = off + old[a] * ma + old[b] * mb + old[c] * mc
            count[i] -= 1
            if not count[i]:
                where[i] = len(open_)
                open_.append(i)
            i = off + new[a] * ma + new[b] * mb + new[c] * mc
            if not count[i]:
                last = open_.pop()
                if last != i:
                    open_[where[i]] = last
                    where[last] = where[i]
                where[i] = -1
            count[i] += 1
        self.rows[r] = new


def _smallest(ix: Interactions, moves: int) -> list[list[int]]:
    """The greedy array, or a smaller one the search finds: first at the lower bound, then
    one row fewer than the best so far until a size fails."""
    rng = _Rng(SEED)
    best = _greedy(ix, rng)
    fixed = len(ix.space.seeds)
    floor = max(_lower_bound(ix), fixed)
    if len(best) <= floor:
        return best
    found = _tabu(ix, best[:floor], fixed, rng, moves)
    if found is not None:
        return found
    while len(best) - 1 > floor:
        start = _drop_one(ix, best, fixed)
        found = _tabu(ix, start, fixed, rng, moves)
        if found is None:
            break
        best = found
    return best


def _drop_one(ix: Interactions, rows: list[list[int]], fixed: int) -> list[list[int]]:
    """`rows` less the non-seed row that alone covers the fewest interactions."""
    count = [0] * ix.total
    ids = [ix.ids(r) for r in rows]
    for row_ids in ids:
        for i in row_ids:
            count[i] += 1
    alone = [sum(count[i] == 1 for i in row_ids) for row_ids in ids]
    drop = min(range(fixed, len(rows)), key=lambda n: alone[n])
    return rows[:drop] + rows[drop + 1 :]
