"""The generated reference pages are the code's: docs/reference/cases.md is what `handoff cases
--markdown` writes for this repository's backends now, so a topology, case, restriction,
outcome or known defect changed in the code and not in the page fails here."""

import re
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


def test_the_explaining_page_copies_nothing_generated_and_links_only_real_sections():
    """docs/cases.md explains; the tables of topologies and outcomes and the lists of case keys
    are the generated page's alone, and each link into that page names one of its sections."""
    page = (REPO / "docs" / "cases.md").read_text()
    tables = re.findall(r"^\| *`?(?:fault )?(?:topology|window)`? *\|.*$", page, re.M)
    assert not tables, f"docs/cases.md copies a generated table: {tables[0]}"
    fenced = re.findall(r"^```[a-z]*\n(.*?)^```", page, re.S | re.M)
    indented = re.findall(r"(?:^    .*\n)+", page, re.M)
    key = re.compile(r"^[a-z_]+/[a-z_]+(-[a-z_]+)+\s*(#.*)?$")
    keys = [line for b in fenced + indented for line in b.splitlines() if key.match(line.strip())]
    assert not keys, f"docs/cases.md lists case keys, which the generated page gives: {keys[0]}"
    headings = re.findall(r"^## (.+)$", PAGE.read_text(), re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
    links = re.findall(r"\]\(reference/cases\.md#([^)]+)\)", page)
    assert links, "docs/cases.md links into no section of the generated page"
    assert not set(links) - slugs, f"no such section of {PAGE}: {set(links) - slugs}"
