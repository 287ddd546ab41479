"""handoff's sessions. `nox -l` lists them; each installs what it needs into its own venv."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests"]

#: ai-dynamo pins aisimulate, which no reachable index serves: install Dynamo without its
#: declared dependencies; handoff-mocker declares the ones the frontend and mocker really use.
DYNAMO = ["ai-dynamo==1.6.1", "ai-dynamo-runtime==1.6.1"]
PACKAGES = ["-e", "packages/core", "-e", "packages/mocker_backend"]
QUALIFY = ["pytest", "--pyargs", "handoff.qualification"]


def install_mocker_stack(session: nox.Session) -> None:
    session.install("--no-deps", *DYNAMO)
    session.install(*PACKAGES, "pytest-xdist")


@nox.session
def tests(session: nox.Session) -> None:
    """The project's own tests: unit, then end to end on the real Dynamo frontend and mocker."""
    install_mocker_stack(session)
    session.install("-e", "tests/example_backend")  # a third-party backend, as users add one
    session.run("pytest", "tests", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff lint and format check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


def qualify_on_mocker(session: nox.Session, selection: str) -> None:
    install_mocker_stack(session)
    session.run(
        *QUALIFY, "--handoff-backend", "mocker", "--handoff-selection", selection, *session.posargs
    )


@nox.session
def mocker_pre_merge(session: nox.Session) -> None:
    """Every topology's pre-merge cases on Dynamo's frontend and mocker workers (no GPU)."""
    qualify_on_mocker(session, "pre_merge")


@nox.session
def mocker_nightly(session: nox.Session) -> None:
    """Every topology's nightly selection (the widest products allowed) on the mocker."""
    qualify_on_mocker(session, "nightly")


@nox.session
def bench(session: nox.Session) -> None:
    """Repeat the mocker pre-merge selection and print pass counts and wall times."""
    install_mocker_stack(session)
    session.run("python", "benchmarks/repeat_selection.py", *session.posargs)
