"""Generated arrays kept on disk: read back by the next process, never stale, never broken."""

import pytest

from handoff.covering import generate as generator
from handoff.covering import stored
from handoff.covering.verify import Forbidden, Model
from handoff.machine.environment import CACHE_ENV

MODEL = Model(
    {"a": ("x", "y"), "b": ("x", "y", "z"), "c": ("x", "y")}, (Forbidden({"a": "x", "b": "z"}),)
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    return tmp_path / "covering"


def searches(monkeypatch) -> list[Model]:
    """The searches run from here on, each recorded."""
    ran: list[Model] = []
    real = generator.generate

    def counted(model, strength):
        ran.append(model)
        return real(model, strength)

    monkeypatch.setattr(generator, "generate", counted)
    return ran


def test_the_first_call_searches_and_the_next_reads_the_same_rows(cache, monkeypatch):
    ran = searches(monkeypatch)
    first = stored.generate(MODEL, 2)
    assert first == generator.generate(MODEL, 2) and len(ran) == 2
    assert len(list(cache.iterdir())) == 1
    assert stored.generate(MODEL, 2) == first and len(ran) == 2


def test_another_model_or_strength_is_another_file(cache, monkeypatch):
    ran = searches(monkeypatch)
    stored.generate(MODEL, 2)
    stored.generate(MODEL, 3)
    stored.generate(Model({**MODEL.axes, "c": ("x", "y", "w")}, MODEL.constraints), 2)
    assert len(ran) == 3 and len(list(cache.iterdir())) == 3


@pytest.mark.parametrize(
    "text",
    ['[{"a": "x"', "[]", '[{"a": "x", "b": "x"}]', '[{"a": "x", "b": "w", "c": "x"}]'],
    ids=["cut short", "no row", "an axis missing", "a value of no axis"],
)
def test_a_file_that_does_not_hold_rows_of_the_model_is_generated_again(cache, monkeypatch, text):
    stored.generate(MODEL, 2)
    (kept,) = cache.iterdir()
    kept.write_text(text)
    ran = searches(monkeypatch)
    assert stored.generate(MODEL, 2) == generator.generate(MODEL, 2)
    assert len(ran) == 2  # the search behind the broken file, then the one to compare


def test_a_cache_that_cannot_be_written_only_costs_the_search(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "a-file"))  # no folder can be made under it
    ran = searches(monkeypatch)
    assert stored.generate(MODEL, 2) == stored.generate(MODEL, 2) and len(ran) == 2


def test_the_cache_is_handoff_cache_else_handoffs_folder_in_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    stored.generate(MODEL, 2)
    assert len(list((tmp_path / "xdg" / "handoff" / "covering").iterdir())) == 1
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "chosen"))
    stored.generate(MODEL, 2)
    assert len(list((tmp_path / "chosen" / "covering").iterdir())) == 1
