"""Every end-to-end test, pass or fail, must leave no process that handoff started."""

import psutil
import pytest


@pytest.fixture(autouse=True)
def nothing_left_running(request):
    """Only the warm pool a qualification run keeps for its next case may outlive a test (the
    pool's own teardown fails the run if it leaves anything), and the docker engine that the
    container tests share (stopped, with its children, after them)."""
    yield
    pools = request.node.funcargs.get("handoff_pools")
    kept = {p.pid for p in pools.live_processes()} if pools else set()
    if engine := request.node.funcargs.get("docker_engine"):
        dockerd = psutil.Process(engine.process.pid)
        kept |= {p.pid for p in [dockerd, *dockerd.children(recursive=True)]}
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in kept]
    assert left == [], f"processes left behind: {[(p.pid, p.name()) for p in left]}"
