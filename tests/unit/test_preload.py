"""A process forked from a warm interpreter starts as `python -m` would: the same state (its
module's import's own changes to the environment, and no other module's), the same exit
(atexit handlers, codes, tracebacks), the same tree to kill; and a launch the warm interpreter
cannot reproduce (another interpreter setting, another value of a variable the import read)
is started with exec."""

import json
import os
import signal
import sys

import psutil
import pytest

from handoff.errors import HandoffError
from handoff.machine import ownership
from handoff.machine.polling import Deadline, poll_until
from handoff.machine.preload import UNREPORTED_EXIT, Forked, Preloader
from handoff.machine.processes import ManagedProcess

#: What the warm interpreter imports for `probe`: it reads one variable and sets another, as
#: Dynamo's mocker sets DYN_COMPUTE_THREADS.
PROBE_LIB = """
import os
LEVEL = os.environ.get("PROBE_LEVEL")
os.environ.setdefault("PROBE_IMPORTED", "yes")
"""
#: Says how it started, then exits as its first argument asks; `probe` imports PROBE_LIB first,
#: `other` does not.
PROBE = """
import atexit, json, os, signal, sys
atexit.register(print, "atexit ran", flush=True)
catchable = [s for s in signal.Signals if s not in (signal.SIGKILL, signal.SIGSTOP)]
print(json.dumps({
    "name": __name__,
    "argv": sys.argv[1:],
    "argv0": os.path.basename(sys.argv[0]),
    "env": {k: v for k, v in os.environ.items() if k != "HANDOFF_STARTED_BY"},
    "cwd": os.getcwd(),
    "session_leader": os.getsid(0) == os.getpid() == os.getpgid(0),
    "nice": os.nice(0),
    "fds": sorted(os.listdir("/proc/self/fd")),
    "stdin": os.readlink("/proc/self/fd/0"),
    "signals": {s.name: str(signal.getsignal(s)) for s in catchable},
    "mask": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "flags": repr(sys.flags),
    "path": sys.path[1:],
    "threads": len(os.listdir("/proc/self/task")),
}), flush=True)
how = sys.argv[1]
if how == "exit":
    sys.exit(int(sys.argv[2]))
if how == "raise":
    raise RuntimeError("the probe failed")
if how == "message":
    sys.exit("a message instead of a code")
if how == "wait":
    signal.pause()
"""


SERVED = {"probe": "probe_lib", "other": "other_lib"}


@pytest.fixture
def probe_env(tmp_path):
    (tmp_path / "probe_lib.py").write_text(PROBE_LIB)
    (tmp_path / "other_lib.py").write_text("")
    (tmp_path / "probe.py").write_text("import probe_lib\n" + PROBE)
    (tmp_path / "other.py").write_text(PROBE)
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), "PYTHONUNBUFFERED": "1"}


def warm(tmp_path, env, base=("json",)) -> Preloader:
    preloader = Preloader(SERVED, base, env, tmp_path / "preloader.log")
    preloader.start()
    return preloader


@pytest.fixture
def preloader(tmp_path, probe_env):
    preloader = warm(tmp_path, probe_env)
    yield preloader
    assert preloader.stop(10) == []
    assert not psutil.pid_exists(preloader.pid)


def started(tmp_path, name, env, args, preloader=None, module="probe") -> ManagedProcess:
    argv = [sys.executable, "-m", module, *args]
    process = ManagedProcess(name, argv, {**env, "ONLY_THIS": name}, tmp_path / f"{name}.log",
                             niceness=3, preloader=preloader)  # fmt: skip
    process.start()
    return process


def told(process: ManagedProcess) -> tuple[dict, list[str]]:
    code = process.exit_code_within(30)
    assert code is not None, process.log_tail()
    lines = process.log_path.read_text().splitlines()
    said = json.loads(lines[0])
    return said, lines[1:]


@pytest.mark.parametrize("module", ["probe", "other"])
@pytest.mark.parametrize(
    ("args", "code", "after"),
    [
        (["return"], 0, ["atexit ran"]),
        (["exit", "0"], 0, ["atexit ran"]),
        (["exit", "3"], 3, ["atexit ran"]),
        (["message"], 1, ["a message instead of a code", "atexit ran"]),
        (["raise"], 1, ["RuntimeError: the probe failed", "atexit ran"]),
    ],
)
def test_a_forked_launch_starts_and_ends_as_one_started_by_exec(
    tmp_path, probe_env, preloader, args, code, after, module
):
    execed = started(tmp_path, "execed", probe_env, args, module=module)
    forked = started(tmp_path, "forked", probe_env, args, preloader, module)
    assert isinstance(forked.popen, Forked) and not isinstance(execed.popen, Forked)
    said_exec, after_exec = told(execed)
    said_fork, after_fork = told(forked)
    assert said_exec["env"].pop("ONLY_THIS") == "execed"
    assert said_fork["env"].pop("ONLY_THIS") == "forked"
    assert said_fork == said_exec
    assert ("PROBE_IMPORTED" in said_fork["env"]) == (module == "probe")
    assert said_fork["session_leader"] and said_fork["nice"] == 3
    assert said_fork["name"] == "__main__" and said_fork["threads"] == 1
    assert forked.exit_code() == execed.exit_code() == code
    assert [line for line in after_fork if line in after] == after
    assert [line for line in after_exec if line in after] == after


def test_a_forked_launch_is_killed_with_its_tree_and_its_code_is_the_signal(
    tmp_path, probe_env, preloader
):
    forked = started(tmp_path, "forked", probe_env, ["wait"], preloader)
    poll_until(lambda: (forked.log_path.read_text() or None, ""), Deadline(10), "the probe")
    assert forked.exit_code() is None and forked.tree()
    forked.kill()
    assert forked.wait_gone(Deadline(10)) == []
    assert forked.exit_code() == -signal.SIGKILL


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (
            {"PYTHONPATH": "{here}:/elsewhere"},
            "another PYTHONPATH: its sitecustomize would not run",
        ),
        ({"LD_PRELOAD": "libc.so.6"}, "a library preloaded at exec"),
        ({"PYTHONDONTWRITEBYTECODE": "1"}, "another interpreter setting"),
        ({"PROBE_LEVEL": "2"}, "another value of a variable the import read"),
    ],
)
def test_a_launch_the_warm_interpreter_cannot_reproduce_is_execed(
    tmp_path, probe_env, preloader, change, why
):
    here = probe_env["PYTHONPATH"]
    env = {**probe_env, **{k: v.format(here=here) for k, v in change.items()}}
    process = started(tmp_path, "execed", env, ["exit", "0"], preloader)
    assert not isinstance(process.popen, Forked), why
    assert told(process)[0]["argv0"] == "probe.py"
    assert not preloader.serves([sys.executable, "-m", "unserved"], probe_env)
    assert not preloader.serves(["/usr/bin/python3", "-m", "probe"], probe_env)
    assert preloader.serves([sys.executable, "-m", "probe", "--flag"], probe_env)


def test_a_variable_another_module_read_does_not_stop_the_fork(tmp_path, probe_env, preloader):
    env = {**probe_env, "PROBE_LEVEL": "2"}
    assert preloader.serves([sys.executable, "-m", "other"], env)
    assert not preloader.serves([sys.executable, "-m", "probe"], env)


def test_a_base_that_changes_the_environment_forks_nothing(tmp_path, probe_env):
    """Every served module would be given what the base's import did: refused, said in the
    log, and every launch is exec'd."""
    preloader = warm(tmp_path, probe_env, base=("probe_lib",))
    assert not preloader.serves([sys.executable, "-m", "other"], probe_env)
    assert "importing probe_lib changed the environment" in preloader.log_path.read_text()
    assert preloader.stop(10) == []


def test_a_preloader_killed_under_its_children_says_their_codes_are_unknown(tmp_path, probe_env):
    preloader = warm(tmp_path, probe_env)
    forked = started(tmp_path, "forked", probe_env, ["wait"], preloader)
    os.killpg(preloader.pid, signal.SIGKILL)  # the warm interpreters, not what they forked
    poll_until(lambda: (preloader.gone() or None, ""), Deadline(10), "the preloader gone")
    assert forked.exit_code() is None  # it still runs
    os.kill(forked.pid, signal.SIGKILL)
    assert forked.popen.wait(10) == UNREPORTED_EXIT
    with pytest.raises(HandoffError, match=r"preloader .* exited before forking probe: see"):
        preloader.spawn([sys.executable, "-m", "probe"], probe_env, tmp_path / "late.log", 0)
    assert preloader.stop(10) == []


def test_a_preloader_stopped_under_a_living_child_is_killed_and_says_so(tmp_path, probe_env):
    preloader = warm(tmp_path, probe_env)
    forked = started(tmp_path, "forked", probe_env, ["wait"], preloader)
    problems = preloader.stop(0.5)
    assert problems == [
        f"the preloader (pid {preloader.pid}) outlived its stop: its children [{forked.pid}] "
        "were not reaped; killed"
    ]
    forked.kill()
    poll_until(lambda: (not psutil.pid_exists(forked.pid) or None, ""), Deadline(10), "gone")
    ownership.forget(forked.pid)
