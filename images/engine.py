"""A docker engine for handoff's container path on a machine without one: Debian's docker.io,
whose dockerd runs as root with no bridge network and no iptables rules, so that containers
can only use the host's network and every server stays on loopback.

    python images/engine.py      # this machine's engine: started unless one answers

The project's tests start a private engine instead (`Engine.start(folder)`: its data root,
state and socket in that folder), and stop it after them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from handoff.commands.container import check_docker_engine
from handoff.errors import HandoffError
from handoff.machine.polling import Deadline, Timeout, poll_until

#: No docker0 bridge (nor its 172.17.0.0/16 addresses) and no iptables rules: containers run
#: with --network host only.
FLAGS = ("--bridge=none", "--iptables=false", "--ip6tables=false")
#: The binaries the container path needs and the Debian packages that hold them.
PACKAGES = {"dockerd": "docker.io", "mmdebstrap": "mmdebstrap"}
READY_TIMEOUT_S = 60.0
MACHINE_LOG = Path(".handoff/dockerd.log")


class EngineError(Exception):
    pass


def answers(environ: dict[str, str] | None = None) -> bool:
    """Whether a docker engine answers `docker info` (at DOCKER_HOST of `environ`, else the
    default), by handoff's own engine check."""
    try:
        check_docker_engine(environ=environ)
    except HandoffError:
        return False
    return True


def install_missing() -> None:
    """Debian's packages for whichever of dockerd and mmdebstrap is missing (root only)."""
    missing = sorted({p for binary, p in PACKAGES.items() if shutil.which(binary) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        raise EngineError(f"{', '.join(missing)} missing: sudo apt-get install {' '.join(missing)}")
    apt = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        if subprocess.run(command, env=apt).returncode != 0:
            raise EngineError(f"`{' '.join(command)}` failed: install {' '.join(missing)} by hand")


class Engine:
    """A dockerd this module started, and the environment that reaches it."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        environ: dict[str, str],
        log: Path,
        folder: Path | None = None,
        data_root: Path | None = None,
    ):
        self.process, self.environ, self.log = process, environ, log
        self.folder, self.data_root = folder, data_root

    @classmethod
    def start(
        cls, folder: Path | None = None, niceness: int = 0, data_root: Path | None = None
    ) -> Engine:
        """dockerd, private to `folder` (state and socket there, and its data root unless
        `data_root` names another, which a later engine may reuse) or, without one, the
        machine's own, at `niceness` (its containers inherit it); back once it answers."""
        install_missing()
        argv, environ = ["dockerd", *FLAGS], dict(os.environ)
        if folder is not None:
            socket = f"unix://{folder / 'docker.sock'}"
            argv += [
                "--data-root", str(data_root or folder / "data"), "--exec-root",
                str(folder / "exec"), "--pidfile", str(folder / "docker.pid"), "--host", socket,
            ]  # fmt: skip
            environ["DOCKER_HOST"] = socket
        log = (folder or Path.cwd()) / ("dockerd.log" if folder else MACHINE_LOG)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=lambda: os.nice(niceness),
            )  # fmt: skip
        engine = cls(process, environ, log, folder, data_root)
        engine.wait_until_it_answers()
        return engine

    def wait_until_it_answers(self) -> None:
        def ready() -> tuple[bool | None, str]:
            if self.process.poll() is not None:
                raise EngineError(f"dockerd exited {self.process.returncode}: {self.tail()}")
            return (True if answers(self.environ) else None), "no answer to `docker info`"

        try:
            poll_until(ready, Deadline(READY_TIMEOUT_S), "dockerd to answer")
        except Timeout as exc:
            self.stop()
            raise EngineError(f"{exc}; its log: {self.tail()}") from None

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-3:]) or f"nothing in {self.log}"

    def stop(self) -> None:
        """SIGTERM to the dockerd this module started; it stops its containers and its
        containerd first. SIGKILL to its process group if it has not within the bound. Then
        unmount what it left mounted in a private folder: dockerd leaves its default network
        namespace mounted there (nsfs), which keeps the namespace and the folder alive."""
        self.process.terminate()
        try:
            self.process.wait(timeout=READY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()
        for folder in filter(None, (self.folder, self.data_root)):
            for mount in mounts_under(folder):
                subprocess.run(["umount", mount], check=True, capture_output=True, timeout=30)

    def keep_only(self, image: str) -> None:
        """Remove every other image of `image`'s repository, and every container and image
        nothing uses: what a reused data root would otherwise pile up run after run."""
        repository = image.rsplit(":", 1)[0]
        listed = self.docker("image", "ls", repository, "--format", "{{.Repository}}:{{.Tag}}")
        for other in set(listed.split()) - {image}:
            self.docker("image", "rm", other)
        self.docker("container", "prune", "--force")
        self.docker("image", "prune", "--force")

    def docker(self, *args: str) -> str:
        done = subprocess.run(
            ["docker", *args], env=self.environ, capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise EngineError(f"`docker {' '.join(args)}` failed: {done.stderr.strip()}")
        return done.stdout


def mounts_under(folder: Path) -> list[str]:
    """The mount points in `folder`, deepest first (this process's view)."""
    inside = str(folder.resolve()) + "/"
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted((p for p in points if p.startswith(inside)), key=len, reverse=True)


def main() -> int:
    if answers():
        print("a docker engine answers already")
        return 0
    try:
        engine = Engine.start()
    except EngineError as exc:
        print(f"images/engine.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"started dockerd (pid {engine.process.pid}, {' '.join(FLAGS)}); log: {engine.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
