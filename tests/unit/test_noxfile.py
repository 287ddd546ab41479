"""The command lines of the sessions too heavy for `nox -s tests` (`upgrade`, `mixed`), and the
release the sessions pin, checked here against a session that records what it is told to run."""

import importlib.util
import os
from pathlib import Path

import pytest

from handoff import releases
from handoff.cases import backend_cases
from handoff.plugins import get_backend

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def noxfile():
    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    cwd = Path.cwd()
    try:
        os.chdir(ROOT)  # it reads requirements/dynamo.txt
        spec.loader.exec_module(module)
    finally:
        os.chdir(cwd)
    return module


class Recorder:
    """What a nox session would run, recorded instead of run."""

    def __init__(self, posargs):
        self.posargs = list(posargs)
        self.runs: list[list[str]] = []

    def run(self, *args, **kwargs):
        self.runs.append(list(args))

    def log(self, *args):
        pass

    def error(self, message):
        raise SystemExit(message)


def test_the_release_the_sessions_pin_is_the_one_handoff_defaults_to(noxfile):
    assert noxfile.DEFAULT_DYNAMO == releases.DEFAULT


def test_the_release_option_is_taken_out_of_what_pytest_gets(noxfile, monkeypatch):
    monkeypatch.setattr(noxfile, "team_release", lambda: None)
    assert noxfile.wanted_release(["-x", "--handoff-dynamo", "1.5.1", "-k", "a"]) == (
        "1.5.1", ["-x", "-k", "a"],
    )  # fmt: skip
    assert noxfile.wanted_release(["-x"]) == (releases.DEFAULT, ["-x"])
    with pytest.raises(SystemExit, match="needs a release"):
        noxfile.wanted_release(["--handoff-dynamo"])


def fake_venvs(noxfile, monkeypatch):
    monkeypatch.setattr(noxfile, "install_debian", lambda *a, **k: None)
    monkeypatch.setattr(noxfile, "release_python", lambda session, r: f"/v/{r}/python")


def upgraded(noxfile, monkeypatch, tmp_path, codes=(0, 0)):
    """The upgrade session's runs, each main job ending with its code of `codes`."""
    fake_venvs(noxfile, monkeypatch)
    started = []

    class Popen:
        def __init__(self, command):
            self.code = codes[len(started)]
            started.append(command)
            folder = Path(command[command.index("--handoff-logs") + 1])
            (folder / "20261207-run").mkdir(parents=True)

        def wait(self):
            return self.code

    monkeypatch.setattr(noxfile.subprocess, "Popen", Popen)
    monkeypatch.chdir(tmp_path)
    session = Recorder(["1.6.0", "1.6.1", "-x"])
    return session, started


def test_upgrade_runs_both_main_jobs_on_halves_of_the_cpus_then_compares(
    noxfile, monkeypatch, tmp_path
):
    session, started = upgraded(noxfile, monkeypatch, tmp_path)
    noxfile.upgrade(session)
    cpus = sorted(os.sched_getaffinity(0))
    for command, release in zip(started, ("1.6.0", "1.6.1"), strict=True):
        assert command[:2] == ["taskset", "-c"] and command[3] == f"/v/{release}/python"
        assert command[4:7] == ["-m", "pytest", "--pyargs"]
        assert ["--handoff-dynamo", release] == command[command.index("--handoff-dynamo") :][:2]
        assert command[-1] == "-x"
    halves = [set(map(int, c[2].split(","))) for c in started]
    assert halves[0] | halves[1] == set(cpus)
    assert len(cpus) < 2 or not halves[0] & halves[1]
    (compare,) = session.runs
    assert compare[:4] == ["/v/1.6.1/python", "-m", "handoff.cli", "compare"]
    # This session's own two runs, never an earlier session's.
    assert [Path(p).parent.name for p in compare[4:]] == ["1.6.0", "1.6.1"]
    assert Path(compare[4]).parents[1] == Path(compare[5]).parents[1]


def test_upgrade_fails_where_the_wanted_releases_main_job_failed(noxfile, monkeypatch, tmp_path):
    session, _ = upgraded(noxfile, monkeypatch, tmp_path, codes=(0, 1))
    with pytest.raises(SystemExit, match=r"the main job on 1\.6\.1 failed"):
        noxfile.upgrade(session)
    assert len(session.runs) == 1  # the diff is printed first


def test_mixed_runs_every_mix_both_ways_and_the_upgrade_one_way(noxfile, monkeypatch):
    fake_venvs(noxfile, monkeypatch)
    session = Recorder(["1.6.0", "1.6.1"])
    noxfile.mixed(session)
    runs = [
        (r[0], r[r.index("--handoff-beside") + 1], r[r.index("--handoff-mix") + 1])
        for r in session.runs
    ]
    assert runs == [
        ("/v/1.6.0/python", "1.6.1", "frontend"), ("/v/1.6.1/python", "1.6.0", "frontend"),
        ("/v/1.6.0/python", "1.6.1", "alternate"), ("/v/1.6.1/python", "1.6.0", "alternate"),
        ("/v/1.6.0/python", "1.6.1", "replacements"),
        ("/v/1.6.0/python", "1.6.1", "prefill"), ("/v/1.6.1/python", "1.6.0", "prefill"),
    ]  # fmt: skip
    cases = {c for r in session.runs for i, c in enumerate(r) if r[i - 1] == "--handoff-case"}
    assert cases == {c for listed in noxfile.MIXED_CASES.values() for c in listed}


def test_every_mixed_case_is_a_pre_merge_case_of_the_mocker(noxfile):
    keys = {c.key for c in backend_cases(get_backend("mocker"), None, "pre_merge")}
    listed = {case for cases in noxfile.MIXED_CASES.values() for case in cases}
    assert listed <= keys, listed - keys


def test_mixed_runs_every_mix_though_one_fails_then_names_those_that_failed(noxfile, monkeypatch):
    fake_venvs(noxfile, monkeypatch)

    class Failing(Recorder):
        def run(self, *args, **kwargs):
            super().run(*args, **kwargs)
            if "alternate" in args:
                raise noxfile.CommandFailed("Returned code 1")

    session = Failing(["1.5.1", "1.6.1"])
    with pytest.raises(SystemExit) as raised:
        noxfile.mixed(session)
    assert len(session.runs) == 7
    assert str(raised.value) == (
        "mixed deployments with a failed case: alternate (1.5.1 with 1.6.1 beside), "
        "alternate (1.6.1 with 1.5.1 beside)"
    )


class Installing(Recorder):
    """A session that records what it installs and logs as well."""

    def __init__(self, posargs):
        super().__init__(posargs)
        self.installed: list[list[str]] = []
        self.logged: list[str] = []

    def install(self, *args, **kwargs):
        self.installed.append(list(args))

    def log(self, *args):
        self.logged.append(" ".join(map(str, args)))


def test_bench_lists_every_script_of_benchmarks_and_none_that_is_gone(noxfile):
    """A retired benchmark leaves the list with its script; a new script must join it (or be a
    module the others import) to be runnable by `nox -s bench -- NAME`."""
    scripts = {path.stem for path in (ROOT / "benchmarks").glob("*.py")}
    listed = set(noxfile.BENCHMARKS)
    assert listed <= scripts, listed - scripts
    assert scripts - listed == set(noxfile.BENCHMARK_MODULES)
    assert set(noxfile.ON_VLLM_CPU) <= listed


def test_bench_runs_the_named_benchmark_with_what_it_needs(noxfile):
    session = Installing(["covering_sizes", "--more", "--repeat", "3"])
    noxfile.bench(session)
    assert ["allpairspy"] in session.installed
    assert session.runs == [["python", "benchmarks/covering_sizes.py", "--more", "--repeat", "3"]]


@pytest.mark.parametrize("posargs", [[], ["case_phases"]])
def test_bench_without_a_known_name_lists_the_benchmarks_and_fails(noxfile, posargs):
    session = Installing(posargs)
    with pytest.raises(SystemExit, match=r"name one: nox -s bench -- NAME"):
        noxfile.bench(session)
    assert session.runs == [] and session.installed == []
    assert [line.split(":")[0] for line in session.logged] == list(noxfile.BENCHMARKS)
    floor = "floor: How far a selection runs from its floor"
    assert any(line.startswith(floor) for line in session.logged)


class Answering(Installing):
    """A session whose silent runs answer with what a command would print."""

    def run(self, *args, **kwargs):
        super().run(*args, **kwargs)
        return "the page\n" if kwargs.get("silent") else None


def test_docs_writes_the_case_reference_of_every_backend_here(noxfile, monkeypatch, tmp_path):
    page = tmp_path / "cases.md"
    monkeypatch.setattr(noxfile, "CASES_PAGE", page)
    session = Answering(["RUN_DIR"])
    noxfile.docs(session)
    named = [a for b in ("mocker", "sglang", "trtllm", "vllm") for a in ("--backend", b)]
    assert session.runs == [
        ["handoff", "cases", "--markdown", *named],
        ["python", "docs/readme_sample.py", "RUN_DIR"],
    ]
    assert page.read_text() == "the page\n"


def test_the_vllm_gpu_session_pins_its_device_whatever_the_team_set(noxfile):
    session = Installing(["-n", "2"])
    noxfile.vllm_pre_merge(session)
    assert session.runs == [
        ["handoff", "qualify", "--backend", "vllm", "--handoff-device", "cuda", "-n", "2"]
    ]
