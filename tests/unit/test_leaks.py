"""A test's leftover processes are killed when it fails for them, so that the next test on the
same xdist worker is not blamed for what it did not start."""

import subprocess
import sys

import psutil
from leaks import reap, running


def test_reap_kills_every_leftover_and_waits_until_it_is_gone():
    started = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(2)
    ]
    left = [psutil.Process(p.pid) for p in started]
    reap(left)
    assert running(left) == []
    assert not any(p.is_running() for p in left)
