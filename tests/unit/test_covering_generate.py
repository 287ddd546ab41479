"""Covering array generation: the known optimum on small models, determinism, seed rows,
constraints, strength 3, unsatisfiable models, and the verifying half (missing, trace,
shortfall) that checks any selection against a promise."""

from itertools import combinations

import pytest
from covering_oracle import allowed_rows, missing_pairs, triples

from handoff.covering.generate import cover, generate, greedy, lower_bound
from handoff.covering.verify import (
    Forbidden,
    Implies,
    Model,
    Space,
    format_interaction,
    missing,
    product_rows,
    required,
    shortfall,
    trace,
)
from handoff.errors import HandoffError


def levels(*counts: int) -> Model:
    return Model({f"x{i}": tuple(str(v) for v in range(n)) for i, n in enumerate(counts)})


#: The issue's models and their known optima (Kleitman-Spencer/Katona for the binary ones; the
#: 4 x 2 product for the rest), each proved by `lower_bound`.
OPTIMA = {
    "2^4": ((2,) * 4, 5),
    "2^5": ((2,) * 5, 6),
    "2^6": ((2,) * 6, 6),
    "2^7": ((2,) * 7, 6),
    "2^8": ((2,) * 8, 6),
    "2^10": ((2,) * 10, 6),
    "4x2^4": ((4,) + (2,) * 4, 8),
    "4x2^6": ((4,) + (2,) * 6, 8),
    "4x2^8": ((4,) + (2,) * 8, 8),
}

AXES = {
    "topology": ("aggregate", "decode", "kv_transfer", "prefill"),
    "policy": ("migration_enabled", "migration_disabled", "max_seq_len_exceeded"),
    "fault": ("worker_failure", "graceful_shutdown"),
    "api": ("chat", "completion"),
    "response": ("stream", "unary"),
}
RULES = (
    Implies("topology", "decode", "response", ("stream",), why="decode faults need a stream"),
    Implies("topology", "kv_transfer", "policy", ("migration_enabled",)),
    Forbidden({"api": "completion", "response": "unary", "fault": "graceful_shutdown"}),
)
FIRST = {
    "topology": "prefill",
    "policy": "max_seq_len_exceeded",
    "fault": "graceful_shutdown",
    "api": "chat",
    "response": "unary",
}
SECOND = dict(FIRST, topology="decode", response="stream")
CONSTRAINED = Model(AXES, RULES, seeds=(FIRST, SECOND))


@pytest.mark.parametrize("name", list(OPTIMA))
def test_the_issues_models_get_their_known_optimum_proved_by_the_lower_bound(name):
    counts, optimum = OPTIMA[name]
    result = cover(levels(*counts))
    assert len(result.rows) == optimum
    assert result.lower_bound == lower_bound(levels(*counts)) == optimum
    assert result.proved_optimal
    assert missing_pairs(levels(*counts).axes, result.rows) == []


def test_the_binary_lower_bound_is_kleitman_spencer_katona():
    # Smallest N with C(N-1, ceil(N/2)) >= k: 4 up to 3 axes, 5 for 4, 6 up to 10, 7 up to 15.
    assert [lower_bound(levels(*(2,) * k)) for k in (2, 3, 4, 5, 10, 11, 15, 16)] == [
        4, 4, 5, 6, 6, 7, 7, 8,
    ]  # fmt: skip
    # Without constraints, otherwise the product of the t largest level counts.
    assert lower_bound(levels(4, 3, 3, 2)) == 12
    assert lower_bound(levels(4, 3, 3, 2), strength=3) == 36


def test_generation_is_deterministic_and_pinned_for_a_small_model():
    assert generate(levels(2, 2, 2, 2)) == generate(levels(2, 2, 2, 2))
    assert generate(CONSTRAINED, 3, moves=500) == generate(CONSTRAINED, 3, moves=500)
    rows = ["".join(row.values()) for row in generate(levels(2, 2, 2, 2))]
    assert rows == ["0001", "0100", "0111", "1010", "1101"]


def test_seed_rows_come_first_in_order_and_the_rest_in_value_order():
    rows = generate(CONSTRAINED)
    assert rows[:2] == [FIRST, SECOND]
    rank = [tuple(AXES[a].index(r[a]) for a in AXES) for r in rows[2:]]
    assert rank == sorted(rank)
    assert greedy(CONSTRAINED)[:2] == [FIRST, SECOND]


@pytest.mark.parametrize("strength", [2, 3])
def test_constraints_are_kept_and_only_allowed_interactions_are_required(strength):
    rows = generate(CONSTRAINED, strength, moves=500)
    allowed = allowed_rows(CONSTRAINED)
    assert all(row in allowed for row in rows)
    names = list(AXES)
    if strength == 2:
        assert {tuple(p) for p in required(CONSTRAINED)} == {
            ((a, r[a]), (b, r[b])) for r in allowed for a, b in combinations(names, 2)
        }
        assert missing_pairs(AXES, rows, allowed) == []
    assert triples(names, rows) >= (triples(names, allowed) if strength == 3 else set())
    assert missing(CONSTRAINED, rows, strength) == []
    # kv_transfer runs one policy and decode one response: those pairs are never required.
    assert (("topology", "decode"), ("response", "unary")) not in required(CONSTRAINED)


def test_strength_three_covers_every_triple_of_a_small_model():
    model = levels(2, 2, 2, 2, 2)
    rows = generate(model, 3)
    assert triples(list(model.axes), rows) == triples(list(model.axes), product_rows(model.axes))
    assert len(rows) == 10  # the known optimum for five binary axes at strength 3
    result = cover(levels(3, 3, 2, 2), 3)
    assert len(result.rows) == result.lower_bound == 18


def test_a_model_whose_constraints_forbid_every_row_names_the_conflicting_ones():
    model = Model(
        {"topology": ("aggregate", "decode"), "response": ("stream", "unary")},
        (
            Implies("topology", "decode", "response", ("stream",)),
            Forbidden({"response": "stream"}),
            Forbidden({"topology": "aggregate", "response": "unary"}),
            Forbidden({"topology": "decode", "response": "unary"}),
        ),
    )
    with pytest.raises(HandoffError) as error:
        generate(model)
    message = str(error.value)
    assert "allow no row" in message
    # The implication is not needed for the conflict: the three forbidden rows make it.
    assert message.endswith(
        "forbidden response=stream; forbidden topology=aggregate & response=unary; "
        "forbidden topology=decode & response=unary"
    )


@pytest.mark.parametrize(
    ("model", "strength", "says"),
    [
        (Model({"a": ("0", "1"), "b": ()}), 2, "axis 'b' needs one or more distinct values"),
        (Model({"a": ("0", "1")}, (Forbidden({"a": "2"}),)), 1, "unknown a '2'"),
        (Model({"a": ("0", "1")}, (Implies("a", "1", "c", ("0",)),)), 1, "unknown axis 'c'"),
        (
            Model({"a": ("0", "1"), "b": ("0", "1")}, (Forbidden({"a": "1", "b": "1"}),),
                  seeds=({"a": "1", "b": "1"},)),
            2,
            "seed row 0 (a=1 & b=1) breaks the constraint forbidden a=1 & b=1",
        ),
        (Model({"a": ("0", "1"), "b": ("0", "1")}, seeds=({"a": "1"},)), 2, "no value for b"),
        (levels(2, 2), 3, "strength 3 needs at least 3 axes"),
        (levels(2, 2, 2, 2), 4, "strength 1 to 3"),
    ],
)  # fmt: skip
def test_a_malformed_model_is_one_clear_error(model, strength, says):
    with pytest.raises(HandoffError, match=says.replace("(", r"\(").replace(")", r"\)")):
        generate(model, strength)


def test_missing_agrees_with_missing_pairs_and_names_what_a_selection_lacks():
    axes = {"a": ("0", "1", "2"), "b": ("x", "y"), "c": ("p", "q")}
    model = Model(axes)
    rows = product_rows(axes)[::3]
    assert missing(model, rows) == missing_pairs(axes, rows)
    # (0,x,p) (0,y,q) (1,y,p) (2,x,q): a=1 never meets b=x nor c=q.
    assert [format_interaction(p) for p in missing(model, rows)][:2] == ["a=1 & b=x", "a=1 & c=q"]


def test_trace_names_the_first_row_covering_each_required_pair():
    rows = generate(CONSTRAINED)
    first = dict(trace(CONSTRAINED, rows))
    assert set(first) == set(required(CONSTRAINED))
    assert first[(("topology", "prefill"), ("policy", "max_seq_len_exceeded"))] == 0
    assert first[(("topology", "decode"), ("response", "stream"))] == 1
    for cells, n in first.items():
        assert all(rows[n][a] == v for a, v in cells)
        assert not any(all(r[a] == v for a, v in cells) for r in rows[:n])
    assert dict(trace(CONSTRAINED, rows[:1]))[(("topology", "decode"), ("api", "chat"))] is None


def test_shortfall_checks_a_hand_written_selection_against_a_promise():
    model = Model(AXES, RULES)
    rows = [FIRST, SECOND]
    gap = shortfall(model, rows, pairs_over=("fault", "api"), each_value_of=("topology",))
    assert gap.lines() == [
        "fault=worker_failure & api=chat",
        "fault=worker_failure & api=completion",
        "fault=graceful_shutdown & api=completion",
        "topology=aggregate",
        "topology=kv_transfer",
    ]
    assert not shortfall(model, generate(model), tuple(AXES), tuple(AXES))
    # A promise over some axes reads only those: the rows may leave the others out.
    partial = [{"fault": f, "api": a} for f in AXES["fault"] for a in AXES["api"]]
    assert not shortfall(model, partial, pairs_over=("api", "fault"))
    with pytest.raises(HandoffError, match="row 0 names unknown api 'grpc'"):
        shortfall(model, [dict(FIRST, api="grpc")], pairs_over=("api", "fault"))


def test_space_rows_are_allowed_rows():
    space = Space(CONSTRAINED)
    allowed = allowed_rows(CONSTRAINED)
    for row in product_rows(AXES):
        assert space.allows(space.encode(row, "row")) == (row in allowed)
