"""Deployments of mixed Dynamo releases, as a rolling upgrade leaves them: some of a case's
processes run from another release's interpreter (the `beside` setting), chosen by the `mix`
setting. Each process is launched as its own release's entry says (its variables, its engine
arguments), from an interpreter checked to hold that release. The case, its workload and its
checks are the same; the processes that ran the other release are recorded in the history
(`ready` and `teardown_done`), and a case none of whose processes did is not proven.

Dynamo promises frontends and workers up to two releases apart work together, both ways; not
prefill with decode of different releases, which `prefill` shows without a promise to hold.
"""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass
from pathlib import Path

from handoff import releases
from handoff.errors import HandoffError

#: Which processes run from the `beside` release.
MIXES = {
    "frontend": "the frontend runs from the beside release, every worker from the installed one",
    "alternate": "every second worker (worker-1, worker-3, ...) runs from the beside release: "
    "a request moved off a worker of one release lands on one of the other",
    "replacements": "the workers started once the deployment is up (a rolling restart's "
    "replacements) run from the beside release: a rolling upgrade",
    "prefill": "the prefill workers run from the beside release, the rest from the installed "
    "one (Dynamo does not promise prefill and decode of different releases)",
}


@dataclass(frozen=True)
class Mix:
    how: str
    release: str
    python: str

    def runs_beside(self, process: str, role: str, index: int, joining: bool) -> bool:
        """Whether `process` ("frontend", or the `index`th worker started for the deployment,
        of `role`; `joining` once the deployment is up) runs from the beside release."""
        if process == "frontend":
            return self.how == "frontend"
        return {
            "alternate": index % 2 == 1,
            "replacements": joining,
            "prefill": role == "prefill",
        }.get(self.how, False)

    def argv(self, argv: list[str], runs_beside: bool) -> list[str]:
        """`argv` (which starts with this interpreter) run by the beside release's instead."""
        return [self.python, *argv[1:]] if runs_beside else argv


def interpreter(release: str) -> Path:
    """The beside release's interpreter: its virtualenv as the sessions make it."""
    return Path(".nox", f"dynamo-{release}", "bin", "python").absolute()


@functools.cache
def release_of(python: str) -> str:
    """The Dynamo release `python` holds: ai-dynamo's, where ai-dynamo-runtime's (the compiled
    runtime) is the same; else both."""
    names = "('ai-dynamo', 'ai-dynamo-runtime')"
    code = f"import importlib.metadata as m; print(*sorted({{m.version(d) for d in {names}}}))"
    done = subprocess.run(
        [python, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout.strip() or f"none ({done.stderr.strip().splitlines()[-1:]})"


def configured(how: str | None, release: str | None) -> Mix | None:
    """The mix the settings ask for, checked: a known mix, a release handoff knows beside, its
    interpreter there and holding it; else one line naming the fix. Each process is launched
    as its own release's entry says (`Pool.launching`)."""
    if how is None and release is None:
        return None
    if how not in MIXES or release is None:
        raise HandoffError(
            f"a mixed deployment needs both --handoff-mix ({', '.join(MIXES)}) and "
            f"--handoff-beside RELEASE; got mix {how!r}, beside {release!r}"
        )
    python = interpreter(release)
    if not python.exists():
        raise HandoffError(
            f"no virtualenv of Dynamo {release} at {python.parent.parent}: `nox -s upgrade -- "
            f"{releases.installed()} {release}` makes it"
        )
    if (held := release_of(str(python))) != release:
        raise HandoffError(f"{python} holds Dynamo {held}, not {release}: remove its folder")
    releases.facts(release)  # one handoff knows
    return Mix(how, release, str(python))
