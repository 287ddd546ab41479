"""A brute-force reference for the covering checks: every pair the allowed rows hold, minus
the pairs the rows cover, found by walking the product. Independent of handoff.covering's
index, so the two can be checked against each other."""

from itertools import combinations

from handoff.covering import product_rows


def pairs_in(axes, rows):
    return {((a, r[a]), (b, r[b])) for r in rows for a, b in combinations(list(axes), 2)}


def missing_pairs(axes, rows, allowed=None):
    """Pairs the allowed rows (default: the full product) hold but `rows` never cover, in
    declared axis and value order."""
    need = pairs_in(axes, product_rows(axes) if allowed is None else allowed)
    rank = {(a, v): i for i, (a, v) in enumerate((a, v) for a in axes for v in axes[a])}
    return sorted(need - pairs_in(axes, rows), key=lambda p: (rank[p[0]], rank[p[1]]))
