"""Build handoff's own runtime images with no image registry: a Debian root filesystem made by
mmdebstrap and imported into docker as the base, then a Dockerfile of this folder on top. An
image's tag is a hash of everything that went into it, so an unchanged image is reused.

    python images/build.py mocker

A team with its own runtime image never needs this: it is how handoff tests its container path
on a machine that reaches no image registry. It needs a docker engine that answers (DOCKER_HOST
is honoured) and, for the base, Debian's mmdebstrap run as root. The last line it prints is
the image, for `--image`.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
VLLM_PACKAGES = ("core", "mocker_backend", "vllm_backend")
#: Image -> its Dockerfile here and what of the repository its build context holds.
IMAGES = {
    "mocker": ("mocker.Dockerfile", ("requirements",)),
    "vllm-cpu": (
        "vllm-cpu.Dockerfile",
        tuple(["noxfile.py", "requirements"] + [f"packages/{p}" for p in VLLM_PACKAGES]),
    ),
}
#: Image -> the packages whose dependencies, not the packages themselves, it holds (a run
#: installs the packages from the mounted checkout): a change to their code builds no new image.
DEPENDENCIES_OF = {"mocker": ("packages/core", "packages/mocker_backend")}
DEPENDENCIES_FILE = "handoff-dependencies.txt"
SUITE = "bookworm"
BOOTSTRAP = "mmdebstrap"
#: What the base holds beyond the minimal set (`minbase`): a Python with venv (whose pip every
#: image installs with), and the certificate store pip needs.
INCLUDE = "python3,python3-venv,ca-certificates"
SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
BUILD_LEFTOVERS = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "*.pyc")


class BuildError(Exception):
    pass


def mirror() -> str:
    """The Debian mirror this machine's apt uses: the base comes from where its packages do."""
    for path in SOURCES:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and len(words) > 1:
                return words[1]
            if words[:1] == ["deb"]:
                return next(w for w in words[1:] if not w.startswith("["))
    raise BuildError(
        f"no Debian mirror in {' or '.join(map(str, SOURCES))}: run this on Debian, whose apt "
        "names the mirror the base image is made from"
    )


def digest(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]


def exists(image: str) -> bool:
    inspected = subprocess.run(["docker", "image", "inspect", image], capture_output=True)
    return inspected.returncode == 0


def run(command: list[str], **kwargs) -> None:
    """Run a step, its output on ours; a failure is one line naming the step."""
    print("+", " ".join(command), flush=True)
    done = subprocess.run(command, **kwargs)
    if done.returncode != 0:
        raise BuildError(f"`{' '.join(command)}` failed with exit {done.returncode} (see above)")


def base() -> str:
    """The Debian base, made by mmdebstrap and imported, unless its tag exists already.
    mmdebstrap, not debootstrap: it downloads in parallel and runs no second stage, a third
    less time and CPU for the same root filesystem (benchmarks/RESULTS.md)."""
    source = mirror()
    parts = (BOOTSTRAP.encode(), SUITE.encode(), INCLUDE.encode(), source.encode())
    tag = f"handoff-base:{SUITE}-{digest(*parts)}"
    if exists(tag):
        return tag
    if shutil.which(BOOTSTRAP) is None:
        raise BuildError(f"{BOOTSTRAP} is missing: apt-get install {BOOTSTRAP} (as root)")
    with tempfile.TemporaryDirectory(prefix="handoff-rootfs-") as folder:
        tarball = str(Path(folder) / "rootfs.tar")
        run([
            BOOTSTRAP, "--quiet", "--variant=minbase", f"--include={INCLUDE}", SUITE, tarball,
            source,
        ])  # fmt: skip
        run(["docker", "import", tarball, tag])
    return tag


def image(name: str) -> str:
    """The named image on the base, built from a context of exactly what it needs."""
    dockerfile, sources = IMAGES[name]
    base_tag = base()
    with tempfile.TemporaryDirectory(prefix="handoff-context-") as folder:
        context = Path(folder)
        for source in sources:
            if (REPO / source).is_file():
                shutil.copy(REPO / source, context / source)
            else:
                shutil.copytree(REPO / source, context / source, ignore=BUILD_LEFTOVERS)
        shutil.copy(HERE / dockerfile, context / dockerfile)
        if name in DEPENDENCIES_OF:
            (context / DEPENDENCIES_FILE).write_text(dependencies(DEPENDENCIES_OF[name]))
        shutil.copy(ca_bundle(), context / "ca-certificates.crt")
        files = sorted(p for p in context.rglob("*") if p.is_file())
        parts = [base_tag.encode()]
        parts += [f"{p.relative_to(context)}".encode() + p.read_bytes() for p in files]
        tag = f"handoff-{name}:{digest(*parts)}"
        if exists(tag):
            return tag
        run([
            "docker", "build", "--network", "host", "--build-arg", f"BASE={base_tag}",
            "-t", tag, "-f", str(context / dockerfile), str(context),
        ])  # fmt: skip
    return tag


def dependencies(packages: tuple[str, ...]) -> str:
    """The requirement lines of `packages`' pyproject.toml, less the packages themselves."""
    projects = [tomllib.loads((REPO / p / "pyproject.toml").read_text()) for p in packages]
    projects = [project["project"] for project in projects]
    own = {project["name"] for project in projects}
    lines = {
        d for project in projects for d in project["dependencies"]
        if re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0] not in own
    }  # fmt: skip
    return "".join(f"{line}\n" for line in sorted(lines))


def ca_bundle() -> Path:
    """The certificates the host's pip trusts (PIP_CERT, else the system bundle)."""
    path = Path(os.environ.get("PIP_CERT", "/etc/ssl/certs/ca-certificates.crt"))
    if not path.is_file():
        raise BuildError(f"no certificate bundle at {path}: set PIP_CERT to the one pip uses")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", choices=sorted(IMAGES), metavar="IMAGE")
    args = parser.parse_args()
    try:
        tags = [image(name) for name in args.names]
    except BuildError as exc:
        print(f"images/build.py: error: {exc}", file=sys.stderr)
        return 2
    for tag in tags:
        print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
