"""Every end-to-end test, pass or fail, must leave no process that handoff started."""

import psutil
import pytest


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    left = psutil.Process().children(recursive=True)
    assert left == [], f"processes left behind: {[(p.pid, p.name()) for p in left]}"
