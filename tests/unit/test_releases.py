"""What differs between Dynamo releases, in one place: each release is its predecessor with its
changes applied, a release handoff does not know or one that differs from its entry fails in
one line, and what a release changed moves the verdict the way its entry says."""

import pytest

from handoff import policies, releases, verdict
from handoff.cases import Case
from handoff.client import Response
from handoff.errors import HandoffError
from handoff.lifecycle import of as lifecycle_of
from handoff_mocker import MockerBackend, engine_arguments

ENGINE = {"speedup_ratio": 1.0, "emit_kv_events": True, "emit_kv_token_ids": False}
DYNAMO = {"enable_local_indexer": True}


def test_each_release_is_the_one_before_with_its_changes():
    older, newer = releases.facts("1.5.1"), releases.facts("1.6.0")
    assert (older.mocker_engine_args, newer.mocker_engine_args) == (
        releases.FLAT,
        releases.SECTIONS,
    )
    assert older.loopback_env["DYN_TCP_RESPONSE_STREAM_HOST"] == "lo"
    assert newer.loopback_env == releases.LOOPBACK_ENV
    assert releases.facts("1.6.1") == releases.facts("1.6.0").__class__(
        **{**vars(releases.facts("1.6.0")), "version": "1.6.1"}
    )  # the null control: nothing handoff relies on changed
    assert releases.facts("1.7.1").counts_refused_moves is False
    assert releases.facts("1.7.1").installable is False


def test_a_value_is_set_by_the_last_change_at_or_before_its_release():
    assert releases.set_by("1.5.1", "refusal_code").startswith("handoff's finding on 1.5.1")
    assert releases.set_by("1.6.1", "refusal_code").startswith("1.6.0 answers a refused move")
    assert releases.set_by("1.6.1", "counts_refused_moves") == "handoff's default"
    assert releases.set_by("1.7.1", "counts_refused_moves").startswith("1.7.1's release notes")


def test_the_changes_between_two_releases_are_the_same_either_way_round():
    forward = releases.changes_between("1.5.1", "1.6.1")
    assert forward == releases.changes_between("1.6.1", "1.5.1")
    assert {version for version, _ in forward} == {"1.6.0"}
    assert releases.changes_between("1.6.0", "1.6.1") == []


def test_a_release_handoff_does_not_know_fails_in_one_line_naming_those_it_knows():
    with pytest.raises(HandoffError) as raised:
        releases.facts("1.4.2")
    assert "\n" not in str(raised.value)
    assert "1.5.0, 1.5.1, 1.6.0, 1.6.1" in str(raised.value)


def test_an_installed_release_other_than_the_one_asked_for_fails_naming_the_session():
    with pytest.raises(HandoffError, match=r"nox -s mocker_pre_merge -- --handoff-dynamo 1\.5\.1"):
        releases.checked("1.5.1", {})


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Where the checks a release passed are remembered: the test's own."""
    monkeypatch.setenv("HANDOFF_CACHE", str(tmp_path / "cache"))


def test_a_release_that_agreed_with_its_entry_is_not_checked_again(monkeypatch):
    modules = {"json.tool": ("--indent",)}
    assert releases.checked(None, modules).version == releases.installed()

    def again(modules):
        raise AssertionError("checked again")

    monkeypatch.setattr(releases, "usages", again)
    assert releases.checked(None, modules).version == releases.installed()
    with pytest.raises(AssertionError, match="checked again"):  # other flags: checked anew
        releases.checked(None, {"json.tool": ("--indent", "--sort-keys")})


def test_a_flag_the_release_lacks_fails_the_check_naming_it():
    """Read from the module's real help (json.tool's here): a flag it does not list is named."""
    with pytest.raises(HandoffError, match=r"it lacks json\.tool --no-such-flag"):
        releases.checked(None, {"json.tool": ("--indent", "--no-such-flag")})
    assert releases.checked(None, {"json.tool": ("--indent",)}).version == releases.installed()


def test_the_installed_runtime_names_every_metric_and_variable_its_entry_says():
    current = releases.current()
    with releases.runtime_binary() as binary:
        assert all(releases.written(binary, m) for m in current.metrics)
        assert all(releases.written(binary, v) for v in current.loopback_env)
        assert not releases.written(binary, "DYN_NO_SUCH_HOST")


def test_the_mocker_engine_arguments_as_each_release_reads_them():
    assert engine_arguments(ENGINE, DYNAMO, releases.facts("1.6.1")) == {
        "engine": ENGINE, "dynamo": DYNAMO,
    }  # fmt: skip
    assert engine_arguments(ENGINE, DYNAMO, releases.facts("1.5.1")) == {
        "speedup_ratio": 1.0, "enable_local_indexer": True,
    }  # fmt: skip
    with pytest.raises(HandoffError, match="cannot emit its KV blocks' token ids"):
        engine_arguments({**ENGINE, "emit_kv_token_ids": True}, DYNAMO, releases.facts("1.5.1"))


def test_a_release_that_counts_no_refused_move_expects_none(monkeypatch):
    refused = lifecycle_of("worker_failure")
    assert policies.expected_outcome("decoding", "migration_disabled", refused).ongoing_request == 1
    monkeypatch.setattr(releases, "current", lambda: releases.facts("1.7.1"))
    outcome = policies.expected_outcome("decoding", "migration_disabled", refused)
    assert (outcome.ongoing_request, outcome.failed) == (0, 1)
    moved = policies.expected_outcome("decoding", "migration_enabled", refused)
    assert moved.ongoing_request == 1  # a permitted move is still counted


def test_a_defect_a_release_fixed_is_not_expected_there(monkeypatch):
    case = Case.from_id("migration_enabled-stall_past_lease-chat-stream-nats")
    assert policies.known_defect(case).issue == "Dynamo issue 3493"
    fixed = releases.replace(releases.facts("1.6.1"), fixed=frozenset({"Dynamo issue 3493"}))
    monkeypatch.setattr(releases, "current", lambda: fixed)
    assert policies.known_defect(case) is None


def test_the_mocker_checks_the_flags_it_passes():
    assert set(MockerBackend.release_modules) == {"dynamo.frontend", "dynamo.mocker"}
    assert "--extra-engine-args" in MockerBackend.release_modules["dynamo.mocker"]


@pytest.mark.parametrize(
    ("status", "error", "carried"),
    [
        (500, {"code": 500, "message": "Failed to generate completions"}, True),
        (200, {"code": 500, "message": "Internal server error"}, True),
        (503, {"code": 503, "message": "Service temporarily unavailable"}, False),
        (200, None, False),
        (404, {"code": 404, "message": "Not found"}, False),
    ],
)
def test_a_release_that_refuses_with_500_still_fails_any_other_answer(
    monkeypatch, status, error, carried
):
    """On 1.5.x the code is promised, not the message; on 1.6.x both."""
    monkeypatch.setattr(releases, "current", lambda: releases.facts("1.5.1"))
    refused = policies.refused_error(policies.SERVICE_UNAVAILABLE)
    assert str(refused) == "500 (any message)"
    assert verdict.carries(Response(status=status, error=error), refused) is carried
    monkeypatch.setattr(releases, "current", lambda: releases.facts("1.6.1"))
    assert policies.refused_error(policies.SERVICE_UNAVAILABLE) == policies.SERVICE_UNAVAILABLE
    strict = verdict.carries(Response(status=status, error=error), policies.SERVICE_UNAVAILABLE)
    assert strict is (status == 503)


STOPPED = [
    "finish_reason None, expected 'length'",
    "None completion tokens in usage, expected 900",
    "the frontend counted no migration at all: worker-0-aggregate, which was faulted, was not "
    "serving the request",
    "migration counter ongoing_request = 0, expected 1",
]


@pytest.mark.parametrize(("release", "outcome"), [("1.6.1", "failed"), ("1.5.1", "known")])
def test_the_drains_500_is_its_sign_unless_the_release_refuses_with_a_500(
    monkeypatch, release, outcome
):
    """A drained stream that just stops, no error, is no expired drain on 1.6.1 (which answers
    it with a 500); on 1.5.1, whose answer to a refused move is a 500 too, the counters are."""
    monkeypatch.setattr(releases, "current", lambda: releases.facts(release))
    judged = verdict.Verdict(False, list(STOPPED), "verdict")
    judged.witnessed = {"drain_cut": (True, "its drain timed out")}
    defect = policies.KNOWN_DEFECTS["drain_expired"]
    result = verdict.against_known_defect(judged, defect)
    assert result.outcome == {"failed": verdict.FAILED, "known": verdict.KNOWN_DEFECT}[outcome]
