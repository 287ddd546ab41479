"""Run the qualification suite inside a team's runtime container image.

    python -m handoff.commands.container --backend B [--image IMAGE] [--model-cache DIR] \\
        [--dry-run] -- [PYTEST_ARGS...]

On the host only the handoff core package is needed: this module checks that the host can run
the image, then starts it with `docker run`. Inside, the handoff packages of this repository
(core and `packages/<backend>_backend`) are installed editable into the image's Python first,
then pytest runs `--pyargs handoff.qualification --handoff-backend <backend>` and the arguments
after `--`. The exit status is docker's: the suite's own, or 125 when docker cannot start the
container (docker prints why, e.g. an image that cannot be pulled, or no NVIDIA Container
Toolkit for `--gpus`).

The image is `--image`, else the HANDOFF_IMAGE environment variable, else `image` of the team's
settings ([tool.handoff.<backend>] of the repository's pyproject.toml, or handoff.toml). The host
model cache is `--model-cache`, else `model_cache` of the settings, else ~/.cache/huggingface.

Before docker runs, three preflight checks answer at once (never hang): the docker binary is on
PATH, a docker engine answers `docker info` within DOCKER_INFO_TIMEOUT_S, and NVML sees an
NVIDIA GPU on the host. All three run (the engine check only when the binary exists) and every
failure goes into ONE line, so a host missing two things says both at once. `--dry-run` checks
only the inputs (backend name and package, image, model cache) and prints the command.

A backend whose workers need no GPU (the mocker; vLLM with `--handoff-device cpu` among the
pytest arguments), as its plugin on the host says, gets no `--gpus` and no GPU check; a backend
the host has no plugin for is taken to need one.

Every container is named `handoff-<backend>-<pid>-<time>` and labelled `handoff.run` with that
name (`docker ps -a --filter label=handoff.run` lists them). docker runs in a session of its
own: Ctrl-C or SIGTERM of this command is passed to it once, and it passes it on to pytest,
which tears its case down and exits; a container still running STOP_TIMEOUT_S later is killed.

The container shares the host's network and pids, so it shares the machine's handoff state
too (handoff.machine.shared): the port leases with the VRAM ledger beside them, and the records
of started processes, each folder mounted at its own path and named by its variable. A
container run and a host run (or two container runs) then lease distinct ports, place on GPUs
through one ledger and reap each other's orphans. Lock files are opened read-only, so a host
user can lock one that root made inside.

Whether the image holds the engine is not probed here: at pytest collection inside the
container the backend's own environment check fails with one line naming what is missing, and
pytest exits non-zero, which becomes this command's exit status.

The container runs as root (no `--user`): runtime images expect it (pip installs into the
image's root-owned Python; engines write caches under /root). Files it writes into the mounted
repository and model cache are therefore root-owned on the host, which would break later host
runs (`.handoff/runs` not writable) and CI checkouts. So, unless the host user is root or the
docker engine is rootless or remaps user namespaces (then files already map to the host user),
a second short container hands back what root owns under `.handoff`, `packages`, the shared
folders and the model cache to the host user after the suite, whatever its outcome.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from handoff.errors import HandoffError
from handoff.machine.environment import gpu_count, require_binary
from handoff.machine.polling import Deadline
from handoff.machine.shared import shared_folders
from handoff.plugins import configured_backend, installed_backends
from handoff.settings import Configuration, find_repository, repository_backends, resolve

IMAGE_ENV = "HANDOFF_IMAGE"
#: The model cache inside the container; HF_HOME points there.
CACHE_IN_CONTAINER = "/root/.cache/huggingface"
DEFAULT_MODEL_CACHE = "~/.cache/huggingface"
#: The most `docker info` may take; running past it is itself the failure.
DOCKER_INFO_TIMEOUT_S = 10.0
#: The most the ownership hand-back may take.
HANDBACK_TIMEOUT_S = 300.0
#: After Ctrl-C or SIGTERM, how long the suite in the container has to tear its case down
#: before the container is killed.
STOP_TIMEOUT_S = 60.0
#: The label on every container this module starts; its value is the container's name.
LABEL = "handoff.run"
#: Host variables passed with their value (shown by --dry-run).
PASS_VALUES = ("CUDA_VISIBLE_DEVICES",)
#: Host variables passed by name only (`-e NAME`: docker reads the value, which may be a
#: secret, from its own environment, so it never appears in the command line).
PASS_NAMES = ("HF_TOKEN", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST")
#: The oldest setuptools that builds handoff's packages (their pyproject.toml's build-system).
SETUPTOOLS_AT_LEAST = 68
#: Fixed container environment: live output (stdout is a pipe, not a terminal) and a quiet pip
#: that does not reach out for its own version check or warn about running as root.
FIXED_ENV = ("PYTHONUNBUFFERED=1", "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_ROOT_USER_ACTION=ignore")
FIX_DOCKER = "install Docker Engine and the NVIDIA Container Toolkit, or put docker on PATH"
FIX_ENGINE = (
    "start the engine (e.g. sudo systemctl start docker), let your user use its socket "
    "(the docker group), or point DOCKER_HOST at a running one"
)
FIX_GPU = "run on a machine with an NVIDIA GPU, its driver and the NVIDIA Container Toolkit"


@dataclass(frozen=True)
class Run:
    """Everything the docker command is built from."""

    backend: str
    image: str
    repo: Path
    model_cache: Path
    pytest_args: tuple[str, ...] = ()
    gpus: bool = True
    name: str = "handoff"
    #: The run folders' parent (--handoff-logs) when it lies outside the repository: mounted
    #: at the same path, so that the run is on the host afterwards.
    logs: Path | None = None
    #: The machine's shared folders by their variables (handoff.machine.shared): mounted at the
    #: same paths and named by the same variables, so the container's runs and the host's
    #: lease distinct ports, share one VRAM ledger and reap each other's orphans.
    shared: tuple[tuple[str, Path], ...] = ()

    @property
    def mounts(self) -> list[str]:
        """Host folders mounted at their own path: the repository, the logs if apart, and the
        shared folders."""
        folders = [self.repo, *([self.logs] if self.logs else []), *(p for _, p in self.shared)]
        return list(dict.fromkeys(str(f) for f in folders))

    @property
    def mount_flags(self) -> list[str]:
        """docker's `-v PATH:PATH` for each of `mounts`."""
        return [arg for path in self.mounts for arg in ("-v", f"{path}:{path}")]


# --- inputs ---------------------------------------------------------------------------------


def check_backend_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise HandoffError(
            f"backend name {name!r} is not a plain identifier: pass one like --backend mocker"
        )
    return name


def find_repo(start: Path) -> Path:
    """The handoff repository at or above `start`: the folder holding packages/core."""
    if (repo := find_repository(start)) is not None:
        return repo
    raise HandoffError(
        f"no handoff repository at or above {start.resolve()} (no packages/core/pyproject.toml): "
        "run this from inside the repository, which is mounted into the container"
    )


def check_backend_package(repo: Path, backend: str) -> None:
    if not (repo / "packages" / f"{backend}_backend" / "pyproject.toml").is_file():
        known = ", ".join(sorted(repository_backends(repo))) or "none"
        raise HandoffError(
            f"no package packages/{backend}_backend in {repo} to install in the container: "
            f"use one of {known}"
        )


def team_settings(backend: str, repo: Path) -> Configuration:
    """The team's settings for `backend`, found from the repository as pytest will inside."""
    return resolve(backend, {}, installed_backends(), start=repo)


def find_image(
    backend: str, flag: str | None, environ: Mapping[str, str], repo: Path
) -> tuple[str, str] | None:
    """The image and where it came from: --image, else HANDOFF_IMAGE, else settings; None
    when none of them names one."""
    if flag is not None:
        image, source = flag, "--image"
    elif IMAGE_ENV in environ:
        image, source = environ[IMAGE_ENV], IMAGE_ENV
    elif (found := team_settings(backend, repo).values.get("image")) is not None:
        image, source = str(found.value), found.source
    else:
        return None
    if not image.strip():
        raise HandoffError(f"the image from {source} is empty: give an image, e.g. repo/name:tag")
    if image.startswith("-") or any(c.isspace() for c in image):
        raise HandoffError(f"the image {image!r} from {source} is not an image reference")
    return image, source


def resolve_image(
    backend: str, flag: str | None, environ: Mapping[str, str], repo: Path
) -> tuple[str, str]:
    """Like find_image, but no image at all is an error naming the three places."""
    found = find_image(backend, flag, environ, repo)
    if found is None:
        raise HandoffError(
            f"no runtime image for {backend}: pass --image IMAGE, set {IMAGE_ENV}, or set "
            f"image in [tool.handoff.{backend}] of {repo / 'pyproject.toml'}"
        )
    return found


def resolve_model_cache(backend: str, flag: str | None, repo: Path) -> Path:
    """The host model cache: --model-cache, else settings, else ~/.cache/huggingface."""
    value = flag
    if value is None:
        value = str(team_settings(backend, repo).get("model_cache", DEFAULT_MODEL_CACHE))
    if not value.strip():
        raise HandoffError("the model cache folder is empty: give a folder, e.g. --model-cache DIR")
    # docker -v takes a relative source for a named volume: always give an absolute path.
    return Path(value).expanduser().absolute()


# --- the commands -----------------------------------------------------------------------------


def install_script(backend: str) -> str:
    """The shell step that installs this checkout's handoff packages into the image's Python:
    with the image's own setuptools where it is recent enough to build them, else in pip's
    isolated build environments (a setuptools download and a build environment per package,
    at every run)."""
    pip = shlex.join([
        "python", "-m", "pip", "install", "-q",
        "-e", "packages/core", "-e", f"packages/{backend}_backend",
    ])  # fmt: skip
    recent = shlex.join([
        "python", "-c",
        "import setuptools, sys; "
        f'sys.exit(int(setuptools.__version__.split(".")[0]) < {SETUPTOOLS_AT_LEAST})',
    ])  # fmt: skip
    return f"if {recent} 2>/dev/null; then {pip} --no-build-isolation; else {pip}; fi"


def pytest_command(backend: str, args: Sequence[str], python: str = "python") -> list[str]:
    """The qualification suite for `backend`, run by `python` (the container's by default)."""
    return [
        python, "-m", "pytest", "--pyargs", "handoff.qualification",
        "--handoff-backend", backend, *args,
    ]  # fmt: skip


def docker_command(run: Run, environ: Mapping[str, str]) -> list[str]:
    """The `docker run` argv (pure: everything comes from `run` and `environ`)."""
    repo = str(run.repo)
    command = [
        "docker", "run", "--rm",
        "--name", run.name, "--label", f"{LABEL}={run.name}",  # found and stopped by these
        *(["--gpus", "all"] if run.gpus else []),  # CUDA_VISIBLE_DEVICES (below) narrows it
        "--network", "host",   # loopback servers and the frontend port behave as on the host
        "--pid", "host",       # NVML reports host pids: they must match the workers' pids
        "--ipc", "host",       # engines' shared memory (NCCL, tensor broadcast) beyond 64 MB
        # no --user: runtime images expect root (see the module docstring)
        *run.mount_flags,  # same paths inside, so log paths printed there hold here
        "-w", repo,
        "-v", f"{run.model_cache}:{CACHE_IN_CONTAINER}",
        "-e", f"HF_HOME={CACHE_IN_CONTAINER}",
    ]  # fmt: skip
    for pair in FIXED_ENV:
        command += ["-e", pair]
    for name, path in run.shared:
        command += ["-e", f"{name}={path}"]
    for name in PASS_VALUES:
        if name in environ:
            command += ["-e", f"{name}={environ[name]}"]
    for name in PASS_NAMES:
        if name in environ:
            command += ["-e", name]
    # pytest replaces the shell, so docker's forwarded signals (Ctrl-C) reach it directly.
    script = (
        f"{install_script(run.backend)} && "
        f"exec {shlex.join(pytest_command(run.backend, run.pytest_args))}"
    )
    return [*command, run.image, "bash", "-c", script]


def handback_command(run: Run, uid: int, gid: int) -> list[str]:
    """A short container that gives what root wrote in the mounts back to uid:gid."""
    repo = str(run.repo)
    return [
        "docker", "run", "--rm", "--network", "none", *run.mount_flags,
        "-v", f"{run.model_cache}:{CACHE_IN_CONTAINER}",
        "--entrypoint", "find", run.image,
        f"{repo}/.handoff", f"{repo}/packages", *run.mounts[1:], CACHE_IN_CONTAINER,
        "-user", "0", "-exec", "chown", "-h", f"{uid}:{gid}", "{}", "+",
    ]  # fmt: skip


# --- preflight ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    """What `docker info` said about the engine."""

    version: str
    security_options: tuple[str, ...]

    @property
    def maps_users(self) -> bool:
        """Rootless or user-namespace remapped: container root is not host root."""
        return any("name=rootless" in o or "name=userns" in o for o in self.security_options)


def check_docker_binary() -> str:
    """The docker binary's path, or one line saying how to get it."""
    return require_binary("docker", FIX_DOCKER)


def check_docker_engine(
    timeout_s: float = DOCKER_INFO_TIMEOUT_S, environ: Mapping[str, str] | None = None
) -> Engine:
    """Ask the engine (at DOCKER_HOST of `environ`, default this process's) for its version;
    no answer within `timeout_s` is itself the failure."""
    target = (environ or os.environ).get("DOCKER_HOST", "the default docker socket")
    try:
        result = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}} {{json .SecurityOptions}}"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
            env=environ,
        )
    except subprocess.TimeoutExpired:
        raise HandoffError(
            f"docker is installed but no docker engine answered `docker info` within "
            f"{timeout_s:g} s at {target}: {FIX_ENGINE}"
        ) from None
    except OSError as exc:
        raise HandoffError(f"docker could not be started ({exc}): {FIX_DOCKER}") from None
    version, _, options = result.stdout.strip().partition(" ")
    if result.returncode != 0 or not version:
        said = next((ln.strip() for ln in result.stderr.splitlines() if ln.strip()), "")
        said = said or f"`docker info` exited {result.returncode} without a server version"
        raise HandoffError(
            f"docker is installed but no docker engine answers ({said}): {FIX_ENGINE}"
        )
    try:
        security = tuple(json.loads(options or "[]") or ())
    except ValueError:
        security = ()
    return Engine(version, security)


def check_gpu() -> int:
    """How many NVIDIA GPUs NVML sees on the host; none is the failure."""
    count, why = gpu_count()
    if not count:
        raise HandoffError(f"no NVIDIA GPU on this host ({why}): {FIX_GPU}")
    return count


def preflight(gpus: bool = True) -> Engine:
    """Run every check (the engine's only when the binary exists; the GPU's only for a backend
    that needs one) and raise ONE line naming everything missing."""
    missing: list[str] = []
    engine = None
    try:
        check_docker_binary()
    except HandoffError as exc:
        missing.append(str(exc))
    else:
        try:
            engine = check_docker_engine()
        except HandoffError as exc:
            missing.append(str(exc))
    try:
        if gpus:
            check_gpu()
    except HandoffError as exc:
        missing.append(str(exc))
    if missing:
        numbered = "; ".join(f"({n}) {m}" for n, m in enumerate(missing, 1))
        raise HandoffError(f"this host cannot run the runtime container: {numbered}")
    assert engine is not None
    return engine


# --- running -----------------------------------------------------------------------------------


class _Stop(Exception):
    """Ctrl-C or SIGTERM to this command, while docker runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def run_docker(command: list[str], name: str) -> int:
    """Run docker and return its exit status. docker runs in a session of its own, so a
    terminal's Ctrl-C reaches it once, through here: each SIGINT or SIGTERM this command gets
    goes to docker, which passes it to pytest in the container, and the wait goes on for the
    suite's teardown; a container still running STOP_TIMEOUT_S after the first is killed."""
    process = subprocess.Popen(command, start_new_session=True)
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    stopping: Deadline | None = None
    try:
        while True:
            try:
                return process.wait(timeout=stopping.remaining() if stopping else None)
            except _Stop as stop:
                process.send_signal(stop.signum)
                stopping = stopping or Deadline(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                kill_container(name)
                stopping = Deadline(DOCKER_INFO_TIMEOUT_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def kill_container(name: str) -> None:
    """`docker kill` the container by the name this module gave it."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            ["docker", "kill", name], capture_output=True, timeout=DOCKER_INFO_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip


def hand_back(run: Run, engine: Engine) -> None:
    """Give root-owned files in the mounts back to the host user (see the module docstring)."""
    uid, gid = os.getuid(), os.getgid()
    if uid == 0 or engine.maps_users:
        return
    try:
        result = subprocess.run(
            handback_command(run, uid, gid),
            capture_output=True,
            text=True,
            timeout=HANDBACK_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        failed = str(exc)
    else:
        lines = result.stderr.strip().splitlines()
        failed = (
            "" if result.returncode == 0 else (lines[-1] if lines else f"exit {result.returncode}")
        )
    if failed:
        places = [f"{run.repo}/.handoff", f"{run.repo}/packages", *run.mounts[1:]]
        print(
            f"handoff: warning: could not give files written as root in {', '.join(places)} "
            f"and {run.model_cache} back to {uid}:{gid} ({failed}); "
            f"remove or chown them with sudo",
            file=sys.stderr,
        )


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, like every handoff error
        if "unrecognized arguments" in message:
            message += " (put pytest's arguments after --)"
        raise HandoffError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m handoff.commands.container",
        description="Run the qualification suite inside a runtime container image. "
        "Arguments after -- go to pytest.",
    )
    p.add_argument(
        "--backend",
        required=True,
        help="backend to qualify: packages/<backend>_backend is installed in the container",
    )
    p.add_argument("--image", help=f"runtime image (default: ${IMAGE_ENV}, else settings)")
    p.add_argument(
        "--model-cache",
        help=f"host model cache folder (default: settings, else {DEFAULT_MODEL_CACHE})",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the docker command and exit; no checks"
    )
    return p


def plan(args: argparse.Namespace, pytest_args: Sequence[str], cwd: Path) -> Run:
    """Check the inputs and resolve the image and the model cache."""
    backend = check_backend_name(args.backend)
    repo = find_repo(cwd)
    check_backend_package(repo, backend)
    image, _ = resolve_image(backend, args.image, os.environ, repo)
    cache = resolve_model_cache(backend, args.model_cache, repo)
    name = f"handoff-{backend}-{os.getpid()}-{time.strftime('%Y%m%d%H%M%S')}"
    gpus = needs_gpu(backend, pytest_args, repo)
    pytest_args, logs = absolute_logs(pytest_args, cwd)
    apart = logs if logs and not logs.is_relative_to(repo) else None
    shared = tuple(shared_folders().items())
    return Run(backend, image, repo, cache, tuple(pytest_args), gpus, name, apart, shared)


def option_value(pytest_args: Sequence[str], option: str) -> tuple[int, str] | None:
    """The index and value of the last `option VALUE` or `option=VALUE` in `pytest_args`."""
    found = None
    for n, arg in enumerate(pytest_args):
        if arg.startswith(option + "="):
            found = n, arg.partition("=")[2]
        elif arg == option and n + 1 < len(pytest_args):
            found = n, pytest_args[n + 1]
    return found


def absolute_logs(pytest_args: Sequence[str], cwd: Path) -> tuple[list[str], Path | None]:
    """`pytest_args` with --handoff-logs made absolute (pytest runs at the repository's root
    inside), and that folder."""
    args = list(pytest_args)
    found = option_value(args, "--handoff-logs")
    if found is None:
        return args, None
    n, value = found
    logs = (cwd / value).resolve()
    args[n : n + (1 if args[n].startswith("--handoff-logs=") else 2)] = [f"--handoff-logs={logs}"]
    return args, logs


def needs_gpu(backend: str, pytest_args: Sequence[str], repo: Path) -> bool:
    """What the backend's plugin on the host says, on the --handoff-device of the pytest
    arguments; a backend the host has no plugin for is taken to need a GPU."""
    found = option_value(pytest_args, "--handoff-device")
    device = found[1] if found else None
    try:
        found = configured_backend(backend, {"device": (device, "--handoff-device")}, repo)
    except HandoffError:
        return True
    return found.needs_gpu


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    own, pytest_args = argv[:split], argv[split + 1 :]
    try:
        args = parser().parse_args(own)
        run = plan(args, pytest_args, Path.cwd())
        command = docker_command(run, os.environ)
        if args.dry_run:
            print(shlex.join(command))
            return 0
        engine = preflight(run.gpus)
        try:
            # Made here, as the host user, so root inside only adds to folders we own.
            run.model_cache.mkdir(parents=True, exist_ok=True)
            (run.repo / ".handoff").mkdir(exist_ok=True)
            if run.logs:
                run.logs.mkdir(parents=True, exist_ok=True)
            for _, folder in run.shared:
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HandoffError(f"cannot create {exc.filename}: {exc.strerror}") from None
    except HandoffError as exc:
        print(f"handoff: error: {exc}", file=sys.stderr)
        return 2
    try:
        return run_docker(command, run.name)
    finally:
        hand_back(run, engine)


if __name__ == "__main__":
    sys.exit(main())
