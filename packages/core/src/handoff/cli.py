"""`handoff`: list backends, their cases and settings. Errors are one line on stderr and exit
code 2."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from handoff.backend import Backend
from handoff.cases import (
    SELECTIONS,
    TOPOLOGIES,
    Case,
    allowed,
    backend_restrictions,
    model,
    promise,
    selection,
    topology,
    unmet,
)
from handoff.commands import container, doctor, profiling
from handoff.commands.catalog import markdown, run_by
from handoff.commands.nightly import print_table, required_missing, run_nightly
from handoff.covering.verify import format_interaction, trace
from handoff.errors import HandoffError
from handoff.machine.environment import gpu_count
from handoff.plugins import ONLY_ENV, configured_backend, load
from handoff.runs import compare, durations, merge, report
from handoff.runs.results import RunResults
from handoff.settings import KEYS

DEVICE_HELP = "the device whose cases and settings to show (default: the device setting)"


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except BrokenPipeError:
        # The reader went away (`handoff cases | head`): stop quietly, as a Unix filter does
        # on SIGPIPE, with nothing more written to the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def run(argv: list[str] | None) -> int:
    parser = command_line()
    args, extra = parser.parse_known_args(argv)
    if args.command == "profile":  # its own parser: handoff.commands.profiling
        return profiling.main(list(argv if argv is not None else sys.argv[1:])[1:])
    if extra and args.command not in ("qualify", "nightly"):  # these pass the rest to pytest
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return dispatched(args, [a for a in extra if a != "--"])
    except HandoffError as exc:
        print(f"handoff: error: {exc}", file=sys.stderr)
        return 2


def dispatched(args: argparse.Namespace, passed: list[str]) -> int:
    """Run the command `args` names; `passed`: what qualify and nightly pass to pytest."""
    if args.command == "backends":
        return list_backends()
    if args.command == "coverage":
        return show_coverage(args.backend, args.device, args.topology, args.selection)
    if args.command == "config":
        return show_config(args.backend, args.device)
    if args.command == "qualify":
        return qualify_backend(args.backend, args.selection, args.image, passed)
    if args.command == "nightly":
        return nightly_run(args.image, Path(args.logs), passed, args.require)
    if args.command == "report":
        return report.report(args.run_dir)
    if args.command == "compare":
        return compare.main(args.run_a, args.run_b)
    if args.command == "doctor":
        return doctor.main()
    if args.command == "durations":
        return write_durations(args.run_dirs, args.output)
    if args.command == "merge":
        merge.merge(args.run_dirs, args.output)
        return report.report(args.output)
    if args.markdown:
        if args.device or args.topology or args.selection != "pre_merge":
            raise HandoffError("--markdown writes every device, topology and selection: drop "
                               "--device, --topology and --selection")  # fmt: skip
        print(markdown(args.backend), end="")
        return 0
    if len(args.backend) > 1:
        raise HandoffError("name one --backend, or several with --markdown")
    return list_cases(args.backend[0], args.device, args.topology, args.selection)


def command_line() -> argparse.ArgumentParser:
    """The `handoff` command and its subcommands."""
    parser = argparse.ArgumentParser(prog="handoff", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("backends", help="installed backends, versions and topologies")
    cases = commands.add_parser(
        "cases", help="a backend's cases as --handoff-case takes them, and the session to run"
    )
    cases.add_argument(
        "--backend", action="append", required=True, help="repeatable with --markdown"
    )
    cases.add_argument(
        "--markdown", action="store_true",
        help="the reference page of the case model for these backends (docs/reference/cases.md)",
    )  # fmt: skip
    cases.add_argument("--device", help=DEVICE_HELP)
    cases.add_argument("--selection", default="pre_merge", choices=SELECTIONS)
    cases.add_argument(
        "--topology", action="append", help="repeatable; default: every topology there is"
    )
    commands.add_parser(
        "profile",
        help="run cases while sampling GPU memory; print their markers (see --help of it)",
        add_help=False,
    )
    coverage = commands.add_parser(
        "coverage", help="a selection's promise, whether it holds, and which row covers what"
    )
    coverage.add_argument("--backend", required=True)
    coverage.add_argument("--device", help=DEVICE_HELP)
    coverage.add_argument("--topology", required=True)
    coverage.add_argument("--selection", default="pre_merge", choices=SELECTIONS)
    config = commands.add_parser("config", help="a backend's effective settings and sources")
    config.add_argument("--backend", required=True)
    config.add_argument("--device", help=DEVICE_HELP)
    qualify = commands.add_parser(
        "qualify",
        help="run a backend's selection: inside its runtime image when one is set, else here",
    )
    qualify.add_argument("--backend", required=True)
    qualify.add_argument("--selection", default="pre_merge", choices=SELECTIONS)
    qualify.add_argument("--image", help="runtime image (default: HANDOFF_IMAGE, else settings)")
    nightly = commands.add_parser(
        "nightly", help="every installed backend's nightly selection where it can run"
    )
    nightly.add_argument("--image", help="runtime container image for the GPU backends")
    nightly.add_argument("--logs", default=".handoff/runs", help="folder for the run's results")
    nightly.add_argument(
        "--require", action="append", default=[], metavar="BACKEND",
        help="fail the night unless this backend ran (repeatable): an engine skipped is not green",
    )  # fmt: skip
    add_run_folder_commands(commands)
    return parser


def add_run_folder_commands(commands: argparse._SubParsersAction) -> None:
    """The commands that read past runs' folders, and the doctor."""
    past_run = commands.add_parser(
        "report", help="a run's case table and failures; writes report.html in its folder"
    )
    past_run.add_argument("run_dir", metavar="RUN_DIR", type=Path, help="the run folder")
    diff = commands.add_parser(
        "compare",
        help="the verdict diff of two runs of one selection (e.g. two Dynamo releases), each "
        "difference with its cause; added to RUN_B's report.html; exit 1 on a regression",
    )
    diff.add_argument("run_a", metavar="RUN_A", type=Path, help="the run before (the release run)")
    diff.add_argument("run_b", metavar="RUN_B", type=Path, help="the run after (the one wanted)")
    commands.add_parser("doctor", help="what this machine has for handoff, and what it lacks")
    timings = commands.add_parser(
        "durations",
        help="pytest-split's durations file from past runs: each case's median seconds",
    )
    timings.add_argument("run_dirs", metavar="RUN_DIR", type=Path, nargs="+")
    timings.add_argument(
        "-o", "--output", type=Path, help="default: the durations_file setting of the backend"
    )
    shards = commands.add_parser(
        "merge", help="the shards of a split run (--splits N --group G) as one run folder"
    )
    shards.add_argument("run_dirs", metavar="RUN_DIR", type=Path, nargs="+")
    shards.add_argument("-o", "--output", type=Path, required=True, help="the merged run folder")


def list_backends() -> int:
    """The backends that loaded; each broken plugin as one line on stderr, and exit 1."""
    table = Table("backend", "version", "topologies", "migration counts")
    loaded = load()
    for name, backend in sorted(loaded.backends.items()):
        table.add_row(
            name, backend.version, ", ".join(backend.topologies), backend.migration_counts
        )
    if loaded.filtered and not loaded.backends and not loaded.broken:
        only = os.environ.get(ONLY_ENV, "")
        raise HandoffError(
            f"{ONLY_ENV}={only!r} matches no installed backend plugin (installed: "
            f"{', '.join(loaded.filtered)}): fix it or unset it"
        )
    Console().print(table)
    if loaded.filtered:
        print(f"handoff: {ONLY_ENV} left out: {', '.join(loaded.filtered)}", file=sys.stderr)
    for problem in loaded.broken.values():
        print(f"handoff: error: {problem}", file=sys.stderr)
    return 1 if loaded.broken else 0


def on_device(backend_name: str, device: str | None) -> tuple[Backend, str]:
    """The backend configured from the settings, on `device` when the command line names one;
    where nothing chose its device but a default, on the device this machine has (its CPU
    device where no GPU answers). With where its device came from."""
    backend = configured_backend(backend_name, {"device": (device, "--device")})
    chosen = backend.configuration.values.get("device") if backend.configuration else None
    source = chosen.source if chosen else f"the {backend_name} backend's first device"
    defaulted = device is None and (chosen is None or source.endswith("default"))
    if defaulted and "cpu" in backend.devices and backend.device != "cpu":
        count, why = gpu_count()
        if not count:
            backend = configured_backend(backend_name, {"device": ("cpu", "--device")})
            source = f"this machine: {why}"
    return backend, source


def list_cases(
    backend_name: str, device: str | None, topologies: list[str] | None, selection_name: str
) -> int:
    """The device (for a backend with several) and what each runs; each topology's cases
    under a `#` header with its promise, or why the backend skips it; each case with its
    markers. Exits 1 when a selection breaks its promise."""
    backend, source = on_device(backend_name, device)
    if backend.devices:
        print(f"# device: {backend.device} (from {source}); --device picks another")
        for name, runs in backend.devices.items():
            print(f"#   {name}: {runs}")
    command = run_by(backend, selection_name)
    print(f"# run by: {command}")
    joiner = " --" if command.startswith("nox") and " -- " not in command else ""
    print(f"# one case: {command}{joiner} --handoff-case TOPOLOGY/ID (a line's first word)")
    broken = False
    for name in topologies or list(TOPOLOGIES):
        topology(name)
        if why := backend.why_not(name):
            print(f"# {name}: not run by {backend_name}: {why}")
            continue
        for r in backend_restrictions(backend, name):
            print(f"# {name}: {backend_name} runs {r.axis} {', '.join(r.allowed)} only: {r.why}")
        chosen = selection(name, selection_name, backend)
        kept = promise(name, selection_name)
        missing = unmet(name, chosen, kept, backend)
        broken = broken or bool(missing)
        full = len(selection(name, "full", backend))
        status = "holds" if not missing else "BROKEN, missing " + "; ".join(missing)
        print(
            f"# {name} {selection_name}: {len(chosen)} of {full} rows; {kept.describe()}: {status}"
        )
        published = set(topology(name).pre_merge_ids)
        for case in chosen:
            print(case_line(backend, case, selection_name, published))
    return 1 if broken else 0


def case_line(backend: Backend, case: Case, selection_name: str, published: set[str]) -> str:
    """`<topology>/<id>  <selection> marker=value ...`, its first word what --handoff-case
    takes; ending in `added` for a pre_merge row that is not published but was added to keep
    the promise over the values the backend runs."""
    markers = " ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in backend.markers(case).items()
    )
    added = selection_name == "pre_merge" and case.id not in published
    return f"{case.key}  {selection_name} {markers}" + ("  added" if added else "")


def show_coverage(
    backend_name: str, device: str | None, topology_name: str, selection_name: str
) -> int:
    """The selection's rows, its promise and whether it holds, and for every promised pair (or
    triple, or value) the first row that covers it. Exits 1 when the promise is broken."""
    backend, _ = on_device(backend_name, device)
    backend.roles(topology(topology_name).name)  # not run by this backend: says why
    chosen = selection(topology_name, selection_name, backend)
    kept = promise(topology_name, selection_name)
    missing = unmet(topology_name, chosen, kept, backend)
    full = len(selection(topology_name, "full", backend))
    status = "holds" if not missing else f"BROKEN: {len(missing)} not covered"
    print(f"# {topology_name} {selection_name} of {backend_name}: {len(chosen)} of {full} rows")
    print(f"# promise: {kept.describe()}: {status}")
    for n, case in enumerate(chosen, 1):
        print(f"{n:>4}  {case.key}")
    print("# traceability: the first row that covers each promised combination")
    covering = model(allowed(topology_name, backend))
    rows = [c.row() for c in chosen]
    wanted = [(3, kept.triples_over), (2, kept.pairs_over)] + [
        (1, (a,)) for a in kept.each_value_of
    ]
    traced = [
        t for strength, axes in wanted if len(axes) >= strength
        for t in trace(covering, rows, strength, axes)
    ]  # fmt: skip
    traced += [
        t for axis in sorted({a for a, _ in kept.cells})
        for t in trace(covering, rows, 1, (axis,)) if t[0][0] in kept.cells
    ]  # fmt: skip
    for cells, first in traced:
        print(f"{format_interaction(cells):<80} {'-' if first is None else first + 1}")
    return 1 if missing else 0


def show_config(backend_name: str, device: str | None) -> int:
    """Every setting's effective value and where it came from."""
    backend = configured_backend(backend_name, {"device": (device, "--device")})
    table = Table(title=f"{backend_name} settings")
    table.add_column("setting", no_wrap=True)
    table.add_column("value", overflow="fold")  # a dict by topology is long: folded, not cut
    table.add_column("from", no_wrap=True)
    table.add_column("meaning")
    assert backend.configuration is not None
    for key, (_, meaning) in KEYS.items():
        found = backend.configuration.values.get(key)
        value, source = (repr(found.value), found.source) if found else ("(not set)", "")
        table.add_row(key, escape(value), escape(source), meaning)  # sources hold [tables]
    Console(width=160).print(table)
    return 0


def qualify_backend(backend: str, selection_name: str, image: str | None, rest: list[str]) -> int:
    """pytest for the backend's selection, inside its image when one is found (--image, else
    HANDOFF_IMAGE, else its `image` setting) and it takes one, else on this machine. Unknown
    arguments go to pytest; pytest's exit status is the result."""
    args = ["--handoff-selection", selection_name, *rest]
    here = load().backends.get(backend)
    takes_image = here is None or "image" in here.uses_settings  # the mocker runs on the host
    repo = container.find_repo(Path.cwd())
    found = container.find_image(backend, image, os.environ, repo) if takes_image else None
    if found is not None:
        return container.main(["--backend", backend, "--image", found[0], "--", *args])
    argv = container.pytest_command(backend, args, sys.executable)
    return subprocess.run(argv, check=False).returncode


def write_durations(run_dirs: list[Path], output: Path | None) -> int:
    runs = [RunResults.load(run_dir) for run_dir in run_dirs]
    found, measured = durations.median_durations(runs)
    if output is None:
        device = (runs[0].device or None, f"the device of {run_dirs[0]}")
        output = durations.path_for(configured_backend(runs[0].backend, {"device": device}))
    durations.write(output, found)
    print(f"{output}: {len(found)} cases, {measured} measured, {len(found) - measured} estimated")
    return 0


def nightly_run(image: str | None, logs: Path, pytest_args: list[str], required: list[str]) -> int:
    """Exit 0 only when something ran, everything that ran passed, and every `required`
    backend was among what ran."""
    run_dir = logs / time.strftime("nightly-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    outcomes = run_nightly(run_dir.resolve(), image, pytest_args)
    print_table(outcomes)
    missing = required_missing(outcomes, required)
    for line in missing:
        print(line)
    ran = [o for o in outcomes if o.ran]
    return 0 if ran and all(o.ok for o in ran) and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
