"""A brute-force reference for the covering checks: every pair the allowed rows hold, minus
the pairs the rows cover, found by walking the product. Independent of handoff.covering.verify's
index, so the two can be checked against each other."""

from itertools import combinations

from handoff.covering.verify import Forbidden, Implies, Model, product_rows


def pairs_in(axes, rows):
    return {((a, r[a]), (b, r[b])) for r in rows for a, b in combinations(list(axes), 2)}


def missing_pairs(axes, rows, allowed=None):
    """Pairs the allowed rows (default: the full product) hold but `rows` never cover, in
    declared axis and value order."""
    need = pairs_in(axes, product_rows(axes) if allowed is None else allowed)
    rank = {(a, v): i for i, (a, v) in enumerate((a, v) for a in axes for v in axes[a])}
    return sorted(need - pairs_in(axes, rows), key=lambda p: (rank[p[0]], rank[p[1]]))


def allowed_rows(model: Model) -> list[dict[str, str]]:
    """The allowed rows by brute force, checked here without handoff's Space."""

    def ok(row: dict[str, str]) -> bool:
        for rule in model.constraints:
            if isinstance(rule, Forbidden) and all(row[a] == v for a, v in rule.cells):
                return False
            if (
                isinstance(rule, Implies)
                and row[rule.axis] == rule.value
                and row[rule.then_axis] not in rule.then
            ):
                return False
        return True

    return [row for row in product_rows(model.axes) if ok(row)]


def triples(axes, rows):
    return {tuple((a, r[a]) for a in combo) for r in rows for combo in combinations(axes, 3)}
