"""Write README.md's sample from a real run of the main job: the rows the README shows, as
`handoff report` prints them, and the run's own tally of every case. Run by `nox -s docs --
RUN_DIR`; tests/unit/test_readme.py checks the sample against the case model."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

from rich.console import Console

from handoff.runs.report import case_table
from handoff.runs.results import RunResults, tally

README = Path(__file__).resolve().parents[1] / "README.md"
START = "<!-- sample: written by docs/readme_sample.py from a run of nox -s mocker_pre_merge -->"
END = "<!-- /sample -->"
#: A row of the sample's table: its case key, the first cell.
ROW = re.compile(r"^ {4}│ (\S+/\S+) ", re.M)


def sample(results: RunResults, keys: list[str]) -> str:
    """The rows named by `keys` and the run's tally, as the terminal shows them, indented."""
    rows = [c for c in results.cases if c.key in keys]
    missing = sorted(set(keys) - {c.key for c in rows})
    if missing:
        raise SystemExit(f"{results.run_dir} has no case {', '.join(missing)}: run the main job")
    console = Console(width=240, file=io.StringIO(), record=True)
    console.print(case_table(rows, title=""))
    console.print(tally(results.cases), highlight=False)
    text = console.export_text(styles=False)
    shown = f"Dynamo {results.dynamo}, {len(results.cases)} cases in {results.wall_s:.0f} s"
    return shown + ":\n\n" + "\n".join(f"    {line}".rstrip() for line in text.splitlines())


def main(run_dir: str) -> None:
    """The sample between README's markers, the rows it names taken again from `run_dir`."""
    text = README.read_text()
    head, found, rest = text.partition(START)
    block, ended, tail = rest.partition(END)
    if not (found and ended):
        raise SystemExit(f"{README} lacks the markers {START!r} and {END!r}: put them back")
    results = RunResults.load(Path(run_dir))
    whole = results.split is None and len(results.cases) == len(results.selection_keys)
    if (results.backend, results.selection, whole) != ("mocker", "pre_merge", True):
        raise SystemExit(
            f"{run_dir} is not a whole run of the main job: run nox -s mocker_pre_merge"
        )
    README.write_text(f"{head}{START}\n{sample(results, ROW.findall(block))}\n{END}{tail}")
    print(f"{README}: the sample of {run_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python docs/readme_sample.py RUN_DIR (a run of the main job)")
    main(sys.argv[1])
