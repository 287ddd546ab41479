"""The verdict paths on the real engine: each misbehaving system fails its case for the right
reason, on Dynamo's vLLM workers running vLLM's CPU build and handoff's tiny model."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import psutil
import pytest
from interrupted_runs import IsolatedRuns, alive
from misbehaving import WrongHolder

from handoff.cases import Case
from handoff.deployment import Deployment
from handoff.machine.polling import Deadline, poll_until
from handoff.machine.processes import group_members
from handoff.policies import POLICIES, policy
from handoff.runner import Settings, run_case
from handoff_vllm import VllmBackend

SETTINGS = Settings(keep_logs=True, startup_timeout_s=300)
STREAM = Case.from_id("migration_enabled-worker_failure-chat-stream-nats", "aggregate")
TIMEOUT_S = 400


def reasons_of(result) -> str:
    assert not result.verdict.passed
    return " | ".join(result.verdict.reasons)


def misconfigured(backend, case, folder, frontend_policy: str):
    """The case against a frontend started with another policy than the case's."""
    policy = POLICIES[frontend_policy]
    return run_case(backend, case, folder, SETTINGS, TIMEOUT_S, frontend_policy=policy)


def test_migration_off_at_the_frontend_fails_a_case_that_expects_it(vllm_cpu, tmp_path):
    result = misconfigured(vllm_cpu, STREAM, tmp_path, "migration_disabled")
    reasons = reasons_of(result)
    assert "the stream carried an error frame" in reasons
    assert "migration counter succeeded = 0, expected 1" in reasons


def test_a_frontend_that_migrates_fails_a_migration_disabled_case(vllm_cpu, tmp_path):
    """The other way round: the policy forbids migration, the frontend migrates anyway."""
    case = Case.from_id("migration_disabled-worker_failure-chat-stream-nats", "aggregate")
    result = misconfigured(vllm_cpu, case, tmp_path, "migration_enabled")
    reasons = reasons_of(result)
    assert "policy migration_disabled requires an API error after the fault" in reasons
    assert "migration counter succeeded = 1, expected 0" in reasons
    read = next(e for e in result.history.events if e.name == "metrics_read")
    assert read.data["counts"]["succeeded"] == 1
    reread = next(e for e in result.history.events if e.name == "metrics_reread")
    assert reread.data["counts"] == read.data["counts"]  # nothing moved after the reading


class WrongWorker(WrongHolder, VllmBackend):
    """A holder detector that points at the idle worker instead of the one serving."""


def test_the_fault_sent_to_the_idle_worker_fails_the_case(vllm_cpu, tmp_path):
    wrong = WrongWorker()
    wrong.configure(vllm_cpu.configuration)
    result = run_case(wrong, STREAM, tmp_path, SETTINGS, TIMEOUT_S)
    faulted = next(e for e in result.history.events if e.name == "fault_sent").data["worker"]
    reasons = reasons_of(result)
    assert f"{faulted}, which was faulted, was not serving the request" in reasons
    assert "migration counter ongoing_request = 0, expected 1" in reasons


class OtherWeights(VllmBackend):
    """One worker serves the same model folder with other weights: vLLM's dummy weights from
    another seed. Same folder, so the same model card: Dynamo's frontend rejects a worker
    whose card differs (its `source_path` is part of the checksum), and would never migrate to
    it. `role` picks the worker: the second of all (the one a migration goes to) or the first
    of a role (a kv_transfer case's prefill worker, whose KV every decode worker then reads)."""

    def __init__(self, role: str | None = None):
        super().__init__()
        self.role, self.launched = role, 0

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        self.launched += 1
        if (self.role is None and self.launched == 2) or role == self.role:
            return replace(launch, argv=[*launch.argv, "--load-format", "dummy", "--seed", "1"])
        return launch


def test_a_worker_with_other_weights_breaks_exact_continuity(vllm_cpu, tmp_path):
    other = OtherWeights()
    other.configure(vllm_cpu.configuration)
    result = run_case(other, STREAM, tmp_path, SETTINGS, TIMEOUT_S)
    reasons = reasons_of(result)
    assert "the migrated text departs from the reference at token " in reasons


def test_a_worker_with_other_weights_fails_a_load_case_for_each_request_it_gave_text(
    vllm_cpu, tmp_path
):
    """Under load every request is judged against its own prompt's reference: those the
    worker with other weights decoded, whether it was faulted or took the moves, fail by
    number."""
    other = OtherWeights()
    other.configure(vllm_cpu.configuration)
    case = Case.from_id("migration_enabled-worker_failure-chat-nats", "load")
    result = run_case(other, case, tmp_path, SETTINGS, TIMEOUT_S)
    wrong = [r for r in result.verdict.reasons if "departs from the reference at token" in r]
    assert wrong and all(r.startswith("request ") for r in wrong), reasons_of(result)


def test_a_prefill_worker_with_other_weights_fails_a_kv_transfer_case(vllm_cpu, tmp_path):
    """Wrong KV, consistently: every request's prefill runs on other weights, so an
    undisturbed baseline would be as wrong as the migrated response and agree with it. The
    reference, which the deployment did not compute, does not."""
    other = OtherWeights(role="prefill")
    other.configure(vllm_cpu.configuration)
    case = Case.from_id("worker_failure-chat-stream-nats", "kv_transfer")
    result = run_case(other, case, tmp_path, SETTINGS, TIMEOUT_S)
    assert "the migrated text departs from the reference at token " in reasons_of(result)


def test_a_sigkilled_worker_leaves_its_engine_core_and_teardown_removes_it(vllm_cpu, tmp_path):
    """The leak is real: SIGKILL to dynamo.vllm alone leaves VLLM::EngineCore running under
    init. Teardown still finds it, by the process group it kept, and kills it."""
    case = Case.from_id("migration_enabled-worker_failure-completion-unary-tcp", "aggregate")
    deployment = Deployment(vllm_cpu, case, tmp_path, policy(case.policy), ("aggregate",))
    try:
        deployment.start(Deadline(300))
        (worker,) = deployment.workers
        engine = poll_until(
            lambda: (
                (found[0], None)
                if (found := engine_children(worker.process.pid))
                else (None, "no VLLM::EngineCore child yet")
            ),
            Deadline(10),
            "the worker's engine process",
        )
        started = engine.create_time()
        os.kill(worker.process.pid, signal.SIGKILL)  # the parent alone, as a crash would
        worker.process.popen.wait()
        assert alive(engine.pid, started), "the engine died with its parent: no leak to test"
        assert engine.pid in [p.pid for p in group_members(worker.process.pid)]
    finally:
        problems = deployment.stop()
    assert problems == []
    assert not alive(engine.pid, started)


def engine_children(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children() if "EngineCore" in " ".join(p.cmdline())]


@pytest.fixture
def runs(tmp_path) -> IsolatedRuns:
    backend = ["--handoff-backend", "vllm", "--handoff-device", "cpu"]
    return IsolatedRuns(tmp_path, STREAM.key, backend, timeout_s=300)


def engine_processes(runs: IsolatedRuns) -> dict[int, float]:
    """Every process in the groups of the recorded ones, once each recorded worker (a pool's
    spare too) has started its engine."""

    def probe():
        found = members(runs)
        workers = [e for e in runs.entries() if e["name"].startswith("worker-")]
        engines = [p for p in found if "EngineCore" in command_line(p)]
        seen = f"{len(engines)} engine processes for {len(workers)} workers"
        return (found if workers and len(engines) >= len(workers) else None), seen

    found = poll_until(probe, Deadline(300), "every worker's engine process")
    return {p.pid: p.create_time() for p in found}


def command_line(process: psutil.Process) -> str:
    """Its command line; empty once it has exited (a start-up helper may be gone already)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def members(runs: IsolatedRuns) -> list[psutil.Process]:
    found = []
    for pid in runs.recorded():
        found += group_members(pid)
    return found


def test_ctrl_c_leaves_no_engine_process(runs):
    run = runs.start()
    runs.wait_for_deployment()
    started = engine_processes(runs)
    run.send_signal(signal.SIGINT)
    out, _ = run.communicate(timeout=120)
    assert run.returncode != 0, out[-2000:]
    runs.assert_clean(started)


def test_a_killed_run_is_reaped_by_the_next_engines_included(runs):
    run = runs.start()
    runs.wait_for_deployment()
    started = engine_processes(runs)  # each worker's VLLM::EngineCore among them
    runs.kill_and_reap(run, started)
    runs.assert_clean(started)
    runs.next_run_is_clean()


#: Starts Dynamo's vLLM worker with a guide of its own on every request it serves (its first
#: argument, a regular expression), whatever the request says: a deployment that imposes
#: structured output on the worker's side, which the frontend cannot see.
IMPOSED_GUIDE = """
import runpy, sys
from vllm.sampling_params import StructuredOutputsParams
from dynamo.vllm import handlers
regex, built = sys.argv[1], handlers.build_sampling_params

def guided(*args, **kwargs):
    params = built(*args, **kwargs)
    params.structured_outputs = StructuredOutputsParams(regex=regex)
    return params

handlers.build_sampling_params = guided
sys.argv = ["dynamo.vllm", *sys.argv[2:]]
runpy.run_module("dynamo.vllm", run_name="__main__", alter_sys=True)
"""


class ImposedGuide(VllmBackend):
    """Its workers impose the guided case's guide themselves, and its requests carry none: the
    frontend takes them for requests it may move, as one without Dynamo's fix 7930 took guided
    ones, and the worker that takes one over starts the guide again."""

    def guide(self, api):
        return replace(super().guide(api), hidden=True)

    def worker(self, role, case, model, ports, folder):
        launch = super().worker(role, case, model, ports, folder)
        python, module = launch.argv[0], launch.argv.index("-m")
        argv = [python, "-c", IMPOSED_GUIDE, self.guide("chat").regex, *launch.argv[module + 2 :]]
        return replace(launch, argv=argv)


def test_a_guided_request_moved_anyway_fails_for_its_guide(vllm_cpu, tmp_path):
    imposed = ImposedGuide()
    imposed.configure(vllm_cpu.configuration)
    case = Case.from_id("migration_enabled-worker_failure-chat-stream-nats", "guided")
    result = run_case(imposed, case, tmp_path, SETTINGS, TIMEOUT_S)
    reasons = reasons_of(result)
    assert "requires an API error after the fault, but the response ended without one" in reasons
    # The successor gave the guide's opening word again, mid-output, where the guide masks it:
    # its log-probabilities name it (handoff_vllm.fingerprint), the text alone matches the guide.
    assert "t5 carries 0.0 at token" in reasons and "which the guide masked" in reasons
