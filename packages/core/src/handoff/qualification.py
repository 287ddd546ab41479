"""The qualification suite: one test, parametrized by the handoff pytest plugin with the cases
of the chosen backend and selection. Run it with `pytest --pyargs handoff.qualification`."""

from __future__ import annotations

import pytest

from handoff.backend import TIMEOUT_MARKER
from handoff.runner import run_case
from handoff.runs import results
from handoff.verdict import KNOWN_DEFECT, NOT_PROVEN, PASSED


def test_migration(
    handoff_case, handoff_backend, handoff_settings, handoff_run_dir, handoff_pools, request
):
    timeout_s = request.node.get_closest_marker(TIMEOUT_MARKER).args[0]
    folder = handoff_run_dir / handoff_case.topology / handoff_case.id
    result = run_case(
        handoff_backend, handoff_case, folder, handoff_settings, timeout_s, pools=handoff_pools
    )
    request.node.user_properties.append(("verdict", result.verdict.summary()))
    request.node.user_properties.extend(result.history.phases().items())
    request.node.user_properties.append((results.PROPERTY, results.CaseRecord.of(result).to_json()))
    outcome = result.verdict.outcome
    if outcome == KNOWN_DEFECT:
        pytest.xfail(f"{result.verdict.upstream_defect}; logs kept: {folder}")
    if outcome == PASSED:
        return
    request.node.user_properties.append(("logs", str(folder)))
    if outcome == NOT_PROVEN and request.config.getoption("handoff_allow_unproven"):
        # Allowed, still never a pass: skipped, with the checks not made and why.
        pytest.skip(f"not proven: {'; '.join(result.verdict.unproven)}; logs kept: {folder}")
    allow = " (--handoff-allow-unproven reports it as skipped)" if outcome == NOT_PROVEN else ""
    pytest.fail(f"{result.verdict.summary()}{allow}\nlogs kept: {folder}", pytrace=False)
