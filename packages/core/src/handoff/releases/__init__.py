"""What differs between Dynamo releases, in one place: per release, the launch facts handoff
relies on, the metrics it reads, what its migration counters mean and which known defects apply.

A release is the one before it with its changes applied, each change one entry with its cause
(a release note, an upstream change, or handoff's own finding): `handoff compare` explains a
verdict that differs between two releases by the changes between them. A release handoff does
not know, or an installed one whose help or binary lacks what its entry says, fails the run at
start in one line naming what differs.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import importlib.metadata
import importlib.util
import mmap
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from handoff.errors import HandoffError
from handoff.machine.environment import cache_root

#: The release handoff qualifies unless told otherwise (`--handoff-dynamo`, `dynamo` setting).
DEFAULT = "1.6.1"
DISTRIBUTION = "ai-dynamo"
#: The frontend's flags handoff passes (deployment.frontend_argv, policies.Policy.flags).
FRONTEND_FLAGS = (
    "--http-host", "--http-port", "--request-plane", "--model-path", "--model-name",
    "--router-mode", "--migration-limit", "--migration-max-seq-len",
)  # fmt: skip
#: The metrics handoff reads, as their names end (the runtime prefixes `dynamo_frontend_` or
#: `dynamo_component_` when it registers them), looked for in the runtime's binary.
METRICS = (
    "model_migration_total", "model_migration_max_seq_len_exceeded_total",
    "output_tokens_total", "input_sequence_tokens", "time_to_first_token_seconds",
    "requests_total", "inflight_requests",
)  # fmt: skip
LOOPBACK = "127.0.0.1"
#: The variables that make Dynamo's processes bind and advertise loopback only.
LOOPBACK_ENV = {
    "DYN_TCP_RPC_HOST": LOOPBACK,
    "DYN_TCP_RESPONSE_STREAM_HOST": LOOPBACK,
    "DYN_EVENT_PLANE_HOST": LOOPBACK,
    "DYN_SYSTEM_HOST": LOOPBACK,
}
#: How the mocker takes its engine arguments (`--extra-engine-args`): one flat object
#: (MockEngineArgs), or an `engine` and a `dynamo` section.
FLAT, SECTIONS = "flat", "sections"


@dataclass(frozen=True)
class Facts:
    """What handoff relies on in one release."""

    version: str
    frontend_flags: tuple[str, ...] = FRONTEND_FLAGS
    metrics: tuple[str, ...] = METRICS
    #: Each is looked for in the runtime's binary, as the metrics are.
    loopback_env: dict[str, str] = field(default_factory=lambda: dict(LOOPBACK_ENV))
    mocker_engine_args: str = SECTIONS
    #: The engine settings that switch the mocker's KV events (and their token ids) on; absent
    #: where the release has no switch.
    mocker_kv_event_switches: bool = True
    #: A fault while decoding is counted as an `ongoing_request` migration even where the policy
    #: then refuses the move (migration disabled, or the context past its cap).
    counts_refused_moves: bool = True
    #: The HTTP code the frontend answers a move it may not make with, whatever its message;
    #: None: the migration path's own errors (503, 504 for a silent worker; `policies`).
    refusal_code: int | None = None
    #: What the frontend logs when a response's stream ends without a cause it migrates on
    #: (the expired drain's witness, `responses.witnesses.drain_cut`), a regular expression.
    unmigrated_end: str = (
        r"Semantic (?:streaming|request) failure class=Internal reason=runtime\.unclassified"
    )
    #: Whether its event plane binds and advertises loopback (DYN_EVENT_PLANE_HOST); where it
    #: does not, every case's events go through a NATS server on loopback.
    event_plane_on_loopback: bool = True
    #: The known defects (`policies.KnownDefect.issue`) fixed by this release or before it:
    #: their cases are judged by the promise alone there, and pass.
    fixed: frozenset[str] = frozenset()
    #: What its model card carries: a frontend keeps the workers of one model whose cards agree
    #: (`policies.MIXED_WORKER_SET`).
    model_card: str = "with source_path"
    #: A mocker case's CPU-seconds against 1.6's, measured: how many cases fit the CPUs at
    #: once (`handoff_mocker.MockerBackend.cpus_per_case`).
    mocker_cpu_scale: float = 1.0
    #: Whether its wheels can be installed here; an entry on paper can be compared against.
    installable: bool = True


@dataclass(frozen=True)
class Change:
    """One thing a release changed that handoff relies on: a field of `Facts` and its new
    value, with where it is written."""

    field: str
    value: object
    cause: str


@dataclass(frozen=True)
class Release:
    version: str
    changes: tuple[Change, ...] = ()
    installable: bool = True
    #: What it changed that handoff does not rely on, where that is worth saying.
    notes: str = ""


#: Oldest first; each release is the one before with its changes applied.
RELEASES = (
    Release(
        "1.5.0",
        (
            Change(
                "loopback_env",
                {
                    "DYN_TCP_RPC_HOST": LOOPBACK,
                    "DYN_TCP_RESPONSE_STREAM_HOST": "lo",
                    "DYN_SYSTEM_HOST": LOOPBACK,
                },
                "1.5.x's response stream server takes an interface's name (an address fails: "
                "`Interface not found: 127.0.0.1`); it reads no DYN_EVENT_PLANE_HOST, and its "
                "model cards name the machine's address, not DYN_SYSTEM_HOST",
            ),
            Change("mocker_engine_args", FLAT, "1.5.x's mocker reads one flat MockEngineArgs"),
            Change(
                "model_card",
                "without source_path",
                "handoff's finding: a 1.5.x worker's model card carries no source_path, a 1.6.x "
                "worker's does, so their checksums differ for one model and its settings",
            ),
            Change(
                "mocker_cpu_scale",
                4.0,
                "handoff's measurement on 1.5.1: its processes start about 6x slower, and three "
                "cases alone took 14 CPU-s against 1.6.1's 3.3 (benchmarks/RESULTS.md)",
            ),
            Change(
                "refusal_code",
                500,
                "handoff's finding on 1.5.1: a move the policy refuses (migration off, the "
                "context past its cap, a request that may not move, a silent worker given up "
                "on) ends with an HTTP 500 (or an error frame of code 500) of varying "
                "messages; its runtime has no 'Request deadline exceeded'. A request whose "
                "every allowed attempt failed still gets the 503",
            ),
            Change(
                "unmigrated_end",
                r"Error processing common response: All output transmitters closed",
                "handoff's finding on 1.5.1: a stream its worker's expired drain ends is logged "
                "as 'All output transmitters closed', unclassified, and not migrated",
            ),
            Change(
                "event_plane_on_loopback",
                False,
                "1.5.x's ZMQ event plane binds every address and advertises the machine's "
                "(no DYN_EVENT_PLANE_HOST): a partition of loopback cannot cut it",
            ),
            Change(
                "mocker_kv_event_switches",
                False,
                "1.5.x's MockEngineArgs has no emit_kv_events nor emit_kv_token_ids",
            ),
        ),
    ),
    Release("1.5.1"),
    Release(
        "1.6.0",
        (
            Change(
                "loopback_env",
                LOOPBACK_ENV,
                "1.6.0 takes addresses for every host, and adds the event plane's and the "
                "status server's",
            ),
            Change(
                "refusal_code",
                None,
                "1.6.0 answers a refused move with the migration path's 503 'Service "
                "temporarily unavailable', a silent worker's with 504 'Request deadline exceeded'",
            ),
            Change(
                "unmigrated_end",
                Facts.unmigrated_end,
                "1.6.0's frontend classes a stream's end ('runtime.unclassified')",
            ),
            Change("event_plane_on_loopback", True, "1.6.0 reads DYN_EVENT_PLANE_HOST"),
            Change("model_card", "with source_path", "1.6.0's model card names its source_path"),
            Change("mocker_cpu_scale", 1.0, "1.6.0's mocker cases: the measured 0.125 CPUs a case"),
            Change(
                "mocker_engine_args",
                SECTIONS,
                "1.6.0 splits the mocker's engine arguments into `engine` and `dynamo` "
                "sections (a flat file fails: unknown field)",
            ),
            Change(
                "mocker_kv_event_switches",
                True,
                "1.6.0's mocker emits KV events and their token ids only when told",
            ),
        ),
    ),
    Release("1.6.1", notes="trust stores, images and tooling only: a null control against 1.6.0"),
    Release(
        "1.7.1",
        (
            Change(
                "counts_refused_moves",
                False,
                "1.7.1's release notes: the migration counter records each permitted retry "
                "once, and the limit gauge reports the frontend's setting",
            ),
        ),
        installable=False,
    ),
)


def known() -> list[str]:
    return [r.version for r in RELEASES]


def facts(version: str) -> Facts:
    """The facts of `version`: its predecessors' changes, then its own."""
    if version not in known():
        raise HandoffError(
            f"Dynamo {version} is not a release handoff knows ({', '.join(known())}): add its "
            f"entry to handoff.releases (what it changed), or choose one of those"
        )
    current = Facts(version)
    for release in RELEASES:
        for change in release.changes:
            current = replace(current, **{change.field: change.value})
        if release.version == version:
            return replace(current, version=version, installable=release.installable)
    raise AssertionError(version)


def changes_between(older: str, newer: str) -> list[tuple[str, Change]]:
    """The changes that the releases after `older` up to `newer` made, each with its release;
    the same whichever way round the two are given."""
    first, last = sorted((known().index(older), known().index(newer)))
    return [(r.version, c) for r in RELEASES[first + 1 : last + 1] for c in r.changes]


def set_by(version: str, name: str) -> str:
    """The cause of the value `version` has for the fact `name`: its last change at or before
    `version`; handoff's default where none changed it."""
    causes = ["handoff's default"]
    for release in RELEASES[: known().index(version) + 1]:
        causes += [c.cause for c in release.changes if c.field == name]
    return causes[-1]


def installed() -> str | None:
    """The ai-dynamo release this interpreter has; None where it has none."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def checked(wanted: str | None, modules: dict[str, tuple[str, ...]]) -> Facts:
    """The facts of the installed release, once it is the one `wanted` (when given) and its
    `modules`' help lists the flags handoff passes them, and its runtime names the metrics
    handoff reads; else one line naming what differs."""
    have = installed()
    if have is None:
        raise HandoffError(f"{DISTRIBUTION} is not installed: run `nox -s mocker_pre_merge`")
    if wanted is not None:
        facts(wanted)  # one handoff knows, else the line that says which it knows
    if wanted is not None and have != wanted:
        raise HandoffError(
            f"this environment holds Dynamo {have}, the run asks for {wanted}: run it from "
            f"`nox -s mocker_pre_merge -- --handoff-dynamo {wanted}`, which installs {wanted}"
        )
    release = facts(have)
    # Once agreed, remembered for this install and this entry: a run's nested runs (the
    # project's tests start dozens) would each import every module again for its help.
    agreed = cache_root() / "releases" / f"{have}-{fingerprint(release, modules)}"
    if agreed.exists():
        return release
    if lacking := lacks(release, modules):
        raise HandoffError(
            f"Dynamo {have} differs from handoff's entry for it: it lacks {', '.join(lacking)}; "
            f"correct that entry in handoff.releases"
        )
    agreed.parent.mkdir(parents=True, exist_ok=True)
    agreed.touch()
    return release


def lacks(release: Facts, modules: dict[str, tuple[str, ...]]) -> list[str]:
    """What the installed release lacks of its entry: flags its modules' help does not list,
    metrics and variables its runtime does not name."""
    helps = usages(list(modules))
    lacking = [f"{m} {f}" for m, flags in modules.items() for f in flags if f not in helps[m]]
    with runtime_binary() as binary:
        names = [f"metric {m}" for m in release.metrics]
        names += [f"variable {v}" for v in release.loopback_env]
        lacking += [n for n in names if not written(binary, n.split()[1])]
    return lacking


def fingerprint(release: Facts, modules: dict[str, tuple[str, ...]]) -> str:
    """What a check agreed on: this interpreter, its runtime's file as installed, the entry
    and the flags checked."""
    spec = importlib.util.find_spec("dynamo._core")
    binary = Path(spec.origin) if spec is not None and spec.origin else None
    stat = binary.stat() if binary is not None else None
    seen = (sys.executable, str(binary), stat and (stat.st_mtime_ns, stat.st_size))
    text = repr((seen, release, sorted(modules.items())))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def written(binary: mmap.mmap, name: str) -> bool:
    """Whether the runtime names `name`; a variable also where it reads it as a field of a
    prefix it names alone (`DYN_SYSTEM_`, then `HOST`: a configuration read from the variables
    of one prefix). A metric's name must be there whole."""
    if binary.find(name.encode()) >= 0:
        return True
    if not name.startswith("DYN_"):
        return False
    prefix = re.escape(name.rsplit("_", 1)[0].encode() + b"_")
    return re.search(prefix + rb"(?:DYN_|[^A-Z])", binary) is not None


def usages(modules: list[str]) -> dict[str, str]:
    """`python -m MODULE --help` of this interpreter for each module, all at once (each
    imports its module: seconds)."""
    helps = {
        m: subprocess.Popen(
            [sys.executable, "-m", m, "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for m in modules
    }
    return {m: process.communicate(timeout=120)[0] for m, process in helps.items()}


def runtime_binary() -> mmap.mmap:
    """Dynamo's compiled runtime, mapped: its metric names and variables are written there."""
    spec = importlib.util.find_spec("dynamo._core")
    if spec is None or spec.origin is None:
        raise HandoffError("Dynamo's runtime (dynamo._core) is not importable: install Dynamo")
    with open(spec.origin, "rb") as binary:
        return mmap.mmap(binary.fileno(), 0, access=mmap.ACCESS_READ)


#: The release a process being launched runs, where it is not this interpreter's (a mix).
LAUNCHING: contextvars.ContextVar[Facts | None] = contextvars.ContextVar("launching", default=None)


def current() -> Facts:
    """The facts of the release at hand: the one a process is being launched from
    (`launching`), else this interpreter's."""
    return LAUNCHING.get() or installed_facts()


@functools.cache
def installed_facts() -> Facts:
    """The facts of the release this interpreter has (the default's where it has none: a
    machine that lists cases, or runs them inside a runtime image)."""
    return facts(installed() or DEFAULT)


@contextlib.contextmanager
def launching(version: str) -> Iterator[Facts]:
    """Within it, `current` is `version`'s: a process of a mix launched as its release says."""
    token = LAUNCHING.set(facts(version))
    try:
        yield LAUNCHING.get()
    finally:
        LAUNCHING.reset(token)
