"""The generated reference pages are the code's: docs/reference/cases.md is what `handoff cases
--markdown` writes for this repository's backends now, so a topology, case, restriction,
outcome or known defect changed in the code and not in the page fails here."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "cases.md"
#: This repository's backends, as `nox -s docs` names them.
BACKENDS = [p.name.removesuffix("_backend") for p in sorted((REPO / "packages").glob("*_backend"))]


def generated() -> str:
    named = [arg for b in BACKENDS for arg in ("--backend", b)]
    argv = [sys.executable, "-m", "handoff.cli", "cases", "--markdown", *named]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_cases_reference_is_what_the_code_writes():
    page = PAGE.read_text()
    assert generated() == page, f"{PAGE} differs from the code: `nox -s docs` writes it again"


def test_the_reference_lists_every_backend_and_topology():
    page = PAGE.read_text()
    assert all(f"\n## {b}" in page for b in BACKENDS), BACKENDS
    assert "| aggregate | aggregate | decoding | one | plain |" in page
