"""docs/writing-a-backend.md's table of the mocker's timings says what `TIMINGS` holds: each
row's topologies and faults, prompt and output tokens, transfer bandwidth and decode speedup."""

import re
from pathlib import Path

from handoff.cases import TOPOLOGIES
from handoff_mocker import TIMINGS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md"
HEADER = "| topology, fault | prompt tokens | output tokens |"


def rows() -> list[list[str]]:
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADER))
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            return table
        table.append([cell.strip() for cell in line.strip("|").split("|")])
    return table


def pairs(cell: str, named_elsewhere: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (topology, fault) pairs a row names: groups split by ';', each its topologies and
    faults in backticks; "the other faults": its topologies' pairs no other row names."""
    found = []
    for group in cell.split(";"):
        names = re.findall(r"`(\w+)`", group)
        topologies = [n for n in names if n in TOPOLOGIES]
        faults = [n for n in names if n not in TOPOLOGIES]
        if "the other faults" in group:
            found += [
                (t, f) for t, f in TIMINGS if t in topologies and (t, f) not in named_elsewhere
            ]
        else:
            found += [(t, f) for t in topologies for f in faults]
    return found


def number(cell: str) -> float | None:
    """A cell's figure; 'none' and '0 (no delay)' are 0; 'as above' says nothing."""
    if cell.startswith("as above"):
        return None
    if cell.startswith(("none", "0 ")):
        return 0.0
    return float(cell.replace(",", ""))


def test_every_row_is_the_code():
    table = rows()
    assert table, f"no table under {HEADER!r} in {PAGE}"
    explicit = {key for cells in table for key in pairs(cells[0], set()) if "other" not in cells[0]}
    for cells in table:
        named = pairs(cells[0], explicit)
        assert named, f"a row names no topology and fault: {cells[0]}"
        prompt, output, transfer, speedup = (number(c) for c in cells[1:5])
        for key in named:
            timing = TIMINGS[key]
            assert (timing.prompt_tokens, timing.output) == (prompt, output), (key, cells)
            if transfer is not None:
                assert timing.transfer_gbps == transfer, (key, cells)
            if speedup is not None:
                assert timing.decode_speedup == speedup, (key, cells)
