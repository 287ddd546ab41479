"""Pairwise coverage: which value pairs a set of rows covers, and which it misses."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations, product

Row = Mapping[str, str]
Pair = tuple[tuple[str, str], tuple[str, str]]


def pairs_of(axes: Sequence[str], rows: Iterable[Row]) -> set[Pair]:
    """Every pair of (axis, value) that stands together in at least one of the rows."""
    return {((a, row[a]), (b, row[b])) for row in rows for a, b in combinations(axes, 2)}


def product_rows(axes: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    """The full Cartesian product of the axes, in axis and value order."""
    return [dict(zip(axes, values, strict=True)) for values in product(*axes.values())]


def missing_pairs(
    axes: Mapping[str, Sequence[str]],
    rows: Iterable[Row],
    allowed: Iterable[Row] | None = None,
) -> list[Pair]:
    """Pairs that the allowed rows (default: the full product) hold but `rows` never cover.

    Sorted in axis and value order, so the first missing pair named is stable across runs.
    """
    names = list(axes)
    need = pairs_of(names, product_rows(axes) if allowed is None else allowed)
    rank = {(a, v): i for i, (a, v) in enumerate((a, v) for a in axes for v in axes[a])}
    return sorted(need - pairs_of(names, rows), key=lambda p: (rank[p[0]], rank[p[1]]))


def format_pair(pair: Pair) -> str:
    """`policy=migration_enabled & fault=worker_failure`: how a missing pair is named."""
    (a, va), (b, vb) = pair
    return f"{a}={va} & {b}={vb}"


def complete(
    rows: Sequence[Row],
    candidates: Sequence[Row],
    pair_axes: Sequence[str],
    value_axes: Sequence[str] = (),
) -> list[Row]:
    """Rows from `candidates` to add to `rows` until every pair over `pair_axes` and every
    value of `value_axes` that the candidates hold is covered.

    Greedy and deterministic: each step takes the first candidate that covers the most of what
    is still missing. Used when a backend cannot run some published rows: the rest keep their
    ids, and the fewest extra rows this finds restore the promise.
    """

    def covers(row: Row) -> set[object]:
        return pairs_of(pair_axes, [row]) | {(a, row[a]) for a in value_axes}

    need: set[object] = set().union(*(covers(c) for c in candidates)) if candidates else set()
    for row in rows:
        need -= covers(row)
    added: list[Row] = []
    while need:
        best = max(candidates, key=lambda c: len(covers(c) & need))
        added.append(best)
        need -= covers(best)
    return added
