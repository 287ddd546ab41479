"""Every wrong context of tests/perturbing_worker/perturbations.py, handed to the engine for real:
inside the successor's worker for a migrated request (as a broken migration would re-issue
it), or inside the prefill worker for every request of a kv_transfer case (the decode worker
then reads another request's KV, or some blocks of it). Each fails the case, and the verdict
names the first token whose log-probabilities depart from handoff's computation."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from perturbing_worker.perturbations import perturbations
from test_engine import SETTINGS, TIMEOUT_S, reasons_of

from handoff.cases import Case
from handoff.runner import run_case
from handoff_vllm import VllmBackend, rule

HERE = Path(__file__).resolve().parents[1] / "perturbing_worker"
MOVED = Case.from_id("migration_enabled-worker_failure-chat-stream-nats", "aggregate")
STOPPED = Case.from_id("worker_failure-completion-stream-tcp", "stop")
#: Its stop strings after the move, the first inside `min_tokens`.
STOPPED_LATER = Case.from_id("worker_failure-chat-stream-nats", "min_tokens")
TRANSFERRED = Case.from_id("worker_failure-chat-stream-nats", "kv_transfer")
#: What a prefill worker can get wrong and still hand over KV of the prompt's length.
KV_WRONGS = ("another request's prompt of the same length", "a KV block of prompt tokens replaced")


class Perturbing(VllmBackend):
    """Workers of `role` (every worker, where None) given the wrong context `name` for each
    request longer than `above` tokens."""

    def __init__(self, name: str, role: str | None, above: int | None):
        super().__init__()
        self.name_of_wrong, self.role, self.above = name, role, above

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        if self.role not in (None, role):
            return launch
        context = len(rule.context_of(self.shape(case).prompt, case.api))
        path = [p for p in (launch.env.get("PYTHONPATH"), str(HERE)) if p]
        env = {
            "PYTHONPATH": ":".join(path),
            "HANDOFF_PERTURB": self.name_of_wrong,
            "HANDOFF_PERTURB_PROMPT": str(context),
            "HANDOFF_PERTURB_ABOVE": str(context if self.above is None else self.above),
            "HANDOFF_PERTURB_CHAT": "1" if case.api == "chat" else "0",
        }
        return replace(launch, env={**launch.env, **env})


def run_wrong(vllm_cpu, tmp_path, case, name, role=None, above=None) -> str:
    backend = Perturbing(name, role, above)
    backend.configure(vllm_cpu.configuration)
    result = run_case(backend, case, tmp_path, SETTINGS, TIMEOUT_S)
    logs = "".join(p.read_text() for p in tmp_path.rglob("worker-*.log"))
    assert f"handoff-test: {name}: " in logs, "no request was perturbed"
    return reasons_of(result)


@pytest.mark.parametrize("name", sorted(perturbations(66, 64, chat=True)))
def test_a_migration_that_re_issues_a_wrong_context_fails_by_the_first_departing_token(
    vllm_cpu, tmp_path, name
):
    reasons = run_wrong(vllm_cpu, tmp_path, MOVED, name)
    departs = re.search(
        r"the log-probabilities depart from the reference at token (\d+): ", reasons
    )
    assert departs and int(departs[1]) > 1, reasons  # after the move: the tokens before it held


@pytest.mark.parametrize("name", KV_WRONGS)
def test_a_decode_worker_given_wrong_kv_fails_by_the_first_departing_token(
    vllm_cpu, tmp_path, name
):
    reasons = run_wrong(vllm_cpu, tmp_path, TRANSFERRED, name, role="prefill", above=0)
    assert "the log-probabilities depart from the reference at token 1: " in reasons


def test_a_successor_whose_first_token_lacks_its_log_probabilities_fails_by_the_count(
    vllm_cpu, tmp_path
):
    """The tokens after the move are right, but one carries no log-probabilities: a token left
    unjudged is no agreement."""
    name = "the first token's log-probabilities dropped"
    reasons = run_wrong(vllm_cpu, tmp_path, MOVED, name)
    counts = re.search(r"(\d+) tokens carry log-probabilities; the client received (\d+)", reasons)
    assert counts and int(counts[2]) - int(counts[1]) == 1, reasons


@pytest.mark.parametrize(
    ("case", "name"),
    [(STOPPED, "two prompt tokens swapped"), (STOPPED_LATER, "a prompt token replaced")],
    ids=["stop", "min_tokens"],
)
def test_a_wrong_context_whose_text_is_right_fails_a_stop_case_by_its_log_probabilities(
    vllm_cpu, tmp_path, case, name
):
    """The rule reads the last token and the parity of distances alone: the successor given
    this context writes the owed words, so the text, the stop strings' matches, the finish and
    the count are all as owed. The log-probabilities of its tokens, those of the string the
    frontend held back among them, are not."""
    reasons = run_wrong(vllm_cpu, tmp_path, case, name)
    departs = re.search(
        r"the log-probabilities depart from the reference at token (\d+): ", reasons
    )
    assert departs and int(departs[1]) > 1, reasons  # after the move: the tokens before it held
    assert "the text departs" not in reasons and "finish_reason" not in reasons, reasons


def test_a_successor_whose_first_word_is_wrong_fails_a_min_tokens_case_by_its_text(
    vllm_cpu, tmp_path
):
    """Its stop strings come long after the move, and the engine's context is right, so both
    still match where planned: the one wrong word the user got is what fails the case."""
    reasons = run_wrong(vllm_cpu, tmp_path, STOPPED_LATER, "the first token replaced")
    assert reasons.startswith("the text departs from the reference before its stop string at "), (
        reasons
    )


def test_a_successor_that_breaks_a_stop_string_across_the_move_fails_by_finish_count_and_text(
    vllm_cpu, tmp_path
):
    """The stop string's match spans the move; the successor's first token is another word, so
    the match never completes and the response runs on to `max_tokens`: what the user then
    gets is not the text before the string, its finish or its count."""
    reasons = run_wrong(vllm_cpu, tmp_path, STOPPED, "the first token replaced")
    assert "finish_reason 'length', expected 'stop'" in reasons
    assert re.search(r"\d+ completion tokens in usage, expected \d+", reasons), reasons
    assert "departs from the reference before its stop string at character" in reasons
