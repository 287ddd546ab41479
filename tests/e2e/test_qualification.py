"""Every topology's pre-merge cases, end to end on Dynamo's frontend and mocker workers.

Collected through the handoff pytest plugin exactly as `nox -s mocker_pre_merge` collects it.
"""

from handoff.qualification import test_migration  # noqa: F401  (collected here)
