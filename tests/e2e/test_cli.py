"""The `handoff` command as a user runs it."""

import json
import subprocess

from handoff.cases import TOPOLOGIES, selection
from handoff_mocker import MockerBackend


def handoff(*args):
    return subprocess.run(["handoff", *args], capture_output=True, text=True, timeout=60)


def test_backends_lists_the_mocker_with_version_and_topologies():
    result = handoff("backends")
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if "mocker" in line)
    assert "0.1.0" in row and "aggregate" in row and "exact" in row


def test_cases_lists_every_topology_with_its_promise():
    result = handoff("cases", "--backend", "mocker", "--selection", "pre_merge")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    cases = [line.split() for line in lines if not line.startswith("#")]
    run = [t for t in TOPOLOGIES if MockerBackend().why_not(t) is None]
    assert [c[0] for c in cases] == [c.key for t in run for c in selection(t, "pre_merge")]
    assert all(c[1:] == ["pre_merge", "handoff_timeout=90"] for c in cases)
    assert "# decode_race: not run by mocker: the mocker's workers take the frontend's" in (
        result.stdout
    )
    headers = [line for line in lines if line.startswith("#") and " pre_merge: " in line]
    assert headers[0] == (
        "# aggregate pre_merge: 30 of 200 rows; every pair over policy, fault, api, response, "
        "plane: holds"
    )
    assert headers[1].startswith("# decode pre_merge: 14 of 96 rows; every pair over fault, api")
    assert all(h.endswith(": holds") for h in headers)


def test_a_listed_case_pasted_into_handoff_case_runs_that_case(tmp_path):
    """The first word of a line of `handoff cases` is what --handoff-case takes, and the
    header names the command to give it to."""
    listed = handoff("cases", "--backend", "mocker", "--topology", "prefill").stdout.splitlines()
    assert "# run by: nox -s mocker_pre_merge" in listed
    assert "# one case: nox -s mocker_pre_merge -- --handoff-case TOPOLOGY/ID" in "\n".join(listed)
    key = next(line for line in listed if not line.startswith("#")).split()[0]
    ran = subprocess.run(
        ["pytest", "--pyargs", "handoff.qualification", "--handoff-backend", "mocker",
         "--handoff-case", key, "--handoff-logs", str(tmp_path), "-p", "no:cacheprovider"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-3000:]
    (results,) = tmp_path.glob("*/results.json")
    assert [c["key"] for c in json.loads(results.read_text())["cases"]] == [key]


def test_unknown_backend_and_topology_fail_in_one_line():
    for args, message in [
        (("cases", "--backend", "nope"), "unknown backend 'nope'"),
        (("cases", "--backend", "mocker", "--topology", "mesh"), "unknown topology 'mesh'"),
    ]:
        result = handoff(*args)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and message in result.stderr
