"""The qualification suite: one test, parametrized by the handoff pytest plugin with the cases
of the chosen backend and selection. Run it with `pytest --pyargs handoff.qualification`."""

from __future__ import annotations

import pytest

from handoff.backend import TIMEOUT_MARKER
from handoff.runner import run_case
from handoff.runs import results


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
    if result.verdict.upstream_defect:
        pytest.xfail(f"{result.verdict.upstream_defect}; logs kept: {folder}")
    if not result.verdict.passed:
        request.node.user_properties.append(("logs", str(folder)))
        pytest.fail(f"{result.verdict.summary()}\nlogs kept: {folder}", pytrace=False)
