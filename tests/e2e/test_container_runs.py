"""The runtime container for real: a docker engine (this machine's if one answers, else a
private one started here, as root, from Debian's docker.io), the mocker's runtime image built
with no image registry (images/build.py), and qualification cases run inside it by `python -m
handoff.commands.container`, exactly as `nox -s mocker_pre_merge -- --image IMAGE` does."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest
from engine import Engine, answers

from handoff.commands.container import LABEL
from handoff.machine.environment import cache_root
from handoff.machine.polling import Deadline, poll_until

pytestmark = pytest.mark.xdist_group("container")
REPO = Path(__file__).resolve().parents[2]
CASES = (
    "aggregate/migration_enabled-worker_failure-chat-stream-nats",
    "aggregate/migration_disabled-graceful_shutdown-completion-stream-nats",
)
RUN_TIMEOUT_S = 300
#: The suite's longest chain is this module's (one xdist worker builds the image, then runs
#: three containers; alone 2 minutes, 4 under the rest of the suite at -n 6 on 2 cores): as
#: root, its engine and its build run at this niceness, so that the other tests fill the cores
#: around it instead of stretching it.
NICENESS = -10 if os.geteuid() == 0 else 0
SAMPLE_S = 0.1


@contextlib.contextmanager
def reused_data_root():
    """The data root kept in handoff's cache folder, so that the image built by the last run
    on this machine is reused (build.py tags an image by what went into it); a private one
    where another run holds it. Locked while the engine runs: one dockerd per data root."""
    cache = cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / "docker.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield cache / "docker"


@pytest.fixture(scope="module")
def docker_engine():
    """None when this machine's engine answers, else a private one started in a short folder
    (dockerd's sockets live under it), stopped after the module."""
    if answers():
        yield None
        return
    folder = Path(tempfile.mkdtemp(prefix="hd-"))
    with reused_data_root() as data_root:
        engine = Engine.start(folder, NICENESS, data_root)
        try:
            yield engine
        finally:
            engine.stop()
            shutil.rmtree(folder)  # nothing of the engine's may be left mounted in it


@pytest.fixture(scope="module")
def docker_env(docker_engine):
    """An environment whose `docker` reaches the engine."""
    return docker_engine.environ if docker_engine else dict(os.environ)


@pytest.fixture(scope="module")
def mocker_image(docker_engine, docker_env) -> str:
    built = subprocess.run(
        [sys.executable, str(REPO / "images/build.py"), "mocker"], cwd=REPO, env=docker_env,
        capture_output=True, text=True, timeout=1800, preexec_fn=lambda: os.nice(NICENESS),
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    image = built.stdout.strip().splitlines()[-1]
    if docker_engine is not None:
        docker_engine.keep_only(image)
    return image


def start(docker_env, image: str, logs: Path) -> subprocess.Popen[str]:
    """The host command, as the mocker session runs it with `--image`."""
    args = [arg for case in CASES for arg in ("--handoff-case", case)]
    command = [
        sys.executable, "-m", "handoff.commands.container", "--backend", "mocker", "--image", image,
        "--", "--handoff-logs", str(logs), "-p", "no:cacheprovider", *args,
    ]  # fmt: skip
    output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    return subprocess.Popen(command, cwd=REPO, env=docker_env, **output)


def containers(docker_env, name_prefix: str = "handoff-") -> list[str]:
    listed = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label={LABEL}", "--format", "{{.Names}}"],
        env=docker_env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return [n for n in listed.stdout.split() if n.startswith(name_prefix)]


class Watcher:
    """The container's processes (it shares the host's pid namespace) and every socket they
    listen on, sampled while it runs."""

    def __init__(self, docker_env, host_pid: int) -> None:
        self.docker_env, self.prefix = docker_env, f"handoff-mocker-{host_pid}-"
        self.root: psutil.Process | None = None
        self.seen: dict[int, float] = {}
        self.listening: set[tuple[str, int]] = set()

    def find_root(self) -> psutil.Process | None:
        """The container's first process, once docker has started it."""
        names = containers(self.docker_env, self.prefix)
        if not names:
            return None
        inspected = subprocess.run(
            ["docker", "inspect", "-f", "{{.State.Pid}}", names[0]], env=self.docker_env,
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        pid = int(inspected.stdout.strip() or 0)
        try:
            return psutil.Process(pid) if pid else None
        except psutil.NoSuchProcess:
            return None

    def sample(self) -> list[psutil.Process]:
        self.root = self.root or self.find_root()
        if self.root is None:
            return []
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        for process in tree:
            try:
                self.seen.setdefault(process.pid, process.create_time())
                for conn in process.net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN:
                        self.listening.add((conn.laddr.ip, conn.laddr.port))
            except psutil.Error:
                continue
        return tree

    def alive(self) -> list[int]:
        def same(pid: int, started: float) -> bool:
            try:
                return abs(psutil.Process(pid).create_time() - started) < 0.01
            except psutil.NoSuchProcess:
                return False

        return [pid for pid, started in self.seen.items() if same(pid, started)]


def command_of(process: psutil.Process) -> list[str]:
    """Its command line; none for a process that has exited (a zombie) meanwhile."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def run_folder(logs: Path) -> Path:
    return next(logs.iterdir())


def test_cases_pass_inside_a_real_container_on_loopback_and_the_host_reads_the_run(
    docker_env, mocker_image
):
    logs = REPO / ".handoff" / "container-tests" / uuid.uuid4().hex[:8]
    run = start(docker_env, mocker_image, logs)
    watcher = Watcher(docker_env, run.pid)
    deadline = Deadline(RUN_TIMEOUT_S)
    while run.poll() is None and not deadline.expired():
        watcher.sample()
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.wait(timeout=SAMPLE_S)  # the sampling period, not a synchronisation
    out, _ = run.communicate(timeout=deadline.remaining())
    assert run.returncode == 0, out[-4000:]
    results = json.loads((run_folder(logs) / "results.json").read_text())
    assert sorted(c["key"] for c in results["cases"]) == sorted(CASES)
    assert all(c["passed"] for c in results["cases"])
    for path in [logs, *logs.rglob("*")]:
        assert path.lstat().st_uid == os.getuid(), path  # the host user's, not only root's
    # Every server of the deployment listened, and only on loopback.
    ports = sorted(watcher.listening)
    assert len(ports) >= 3, ports  # the frontend, a worker's system port, NATS at least
    assert {ip for ip, _ in ports} == {"127.0.0.1"}, ports
    report = subprocess.run(
        [sys.executable, "-m", "handoff.cli", "report", str(run_folder(logs))], cwd=REPO,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr
    assert (run_folder(logs) / "report.html").is_file()
    assert containers(docker_env, watcher.prefix) == []
    shutil.rmtree(logs)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_mid_case_leaves_no_container_and_no_process(docker_env, mocker_image, sig):
    logs = REPO / ".handoff" / "container-tests" / uuid.uuid4().hex[:8]
    run = start(docker_env, mocker_image, logs)
    watcher = Watcher(docker_env, run.pid)

    def frontend_up() -> tuple[bool | None, int]:
        tree = watcher.sample()
        up = any("dynamo.frontend" in " ".join(command_of(p)) for p in tree)
        return (True if up else None), len(tree)

    try:
        poll_until(frontend_up, Deadline(RUN_TIMEOUT_S), "a case's frontend in the container")
    finally:
        run.send_signal(sig)  # also when the wait failed: the run must not outlive the test
    out, _ = run.communicate(timeout=120)
    assert run.returncode != 0, out[-3000:]
    assert containers(docker_env, watcher.prefix) == []
    assert watcher.alive() == [], out[-3000:]
    shutil.rmtree(logs, ignore_errors=True)
