"""Properties of generated covering arrays over random small models with random constraints,
checked against a brute-force oracle that does not use handoff's own constraint code.

Derandomized: hypothesis draws the same examples on every run, so a failure reproduces."""

from collections import Counter

from covering_oracle import allowed_rows, missing_pairs, triples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from handoff.covering.generate import generate, lower_bound
from handoff.covering.verify import (
    Forbidden,
    Implies,
    Model,
    missing,
    pairs_of,
)
from handoff.errors import HandoffError

#: Correctness, not size, is under test here: a small search budget keeps each example quick.
MOVES = 300
SETTINGS = settings(
    max_examples=100,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def models(draw, axes=(2, 6), values=(2, 4), forbidden=3, implications=2):
    counts = draw(st.lists(st.integers(*values), min_size=axes[0], max_size=axes[1]))
    space = {f"a{i}": tuple(f"v{j}" for j in range(n)) for i, n in enumerate(counts)}
    names = list(space)
    rules = []
    for _ in range(draw(st.integers(0, forbidden))):
        a, b = draw(st.lists(st.sampled_from(names), min_size=2, max_size=2, unique=True))
        rules.append(
            Forbidden({a: draw(st.sampled_from(space[a])), b: draw(st.sampled_from(space[b]))})
        )
    for _ in range(draw(st.integers(0, implications))):
        a, b = draw(st.lists(st.sampled_from(names), min_size=2, max_size=2, unique=True))
        then = draw(st.lists(st.sampled_from(space[b]), min_size=1, unique=True))
        rules.append(Implies(a, draw(st.sampled_from(space[a])), b, tuple(then)))
    return Model(space, tuple(rules))


def generated(model: Model, strength: int) -> list[dict[str, str]] | None:
    """The generated rows, or None where the model allows no row (then that is the error)."""
    try:
        return generate(model, strength, moves=MOVES)
    except HandoffError as error:
        assert "allow no row" in str(error)
        assert allowed_rows(model) == []
        return None


@SETTINGS
@given(models())
def test_every_allowed_pair_is_covered_and_no_row_breaks_a_constraint(model):
    rows = generated(model, 2)
    if rows is None:
        return
    oracle = allowed_rows(model)
    assert all(row in oracle for row in rows)
    assert pairs_of(list(model.axes), rows) == pairs_of(list(model.axes), oracle)
    assert lower_bound(model) <= len(rows)


@SETTINGS
@given(models())
def test_the_verifier_finds_exactly_the_pairs_a_removed_row_alone_covered(model):
    rows = generated(model, 2)
    event("unsatisfiable" if rows is None else "generated")
    if rows is None:
        return
    names = list(model.axes)
    held = Counter(p for row in rows for p in pairs_of(names, [row]))
    for n, row in enumerate(rows):
        alone = pairs_of(names, [row]) & {p for p, c in held.items() if c == 1}
        if alone:
            rest = rows[:n] + rows[n + 1 :]
            gap = missing_pairs(model.axes, rest, allowed_rows(model))
            assert set(gap) == alone
            assert missing(model, rest) == gap
            event("a row removed")
            return


@settings(SETTINGS, max_examples=40)
@given(models(axes=(3, 5), values=(2, 3), forbidden=2, implications=1))
def test_strength_three_covers_every_allowed_triple(model):
    rows = generated(model, 3)
    if rows is None:
        return
    oracle = allowed_rows(model)
    assert all(row in oracle for row in rows)
    assert triples(list(model.axes), rows) == triples(list(model.axes), oracle)
    assert missing(model, rows, 3) == []
