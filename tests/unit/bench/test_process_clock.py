"""``seconds_since_process_start`` (reasonrl/bench/records.py) counts from the process's own start, not from the
caller's first line: a child that burns a known half second before asking reads at least that, and no more than the
parent saw the whole child take."""
import subprocess
import sys
import time

from paths import REPO

CHILD = """
import time
t = time.monotonic()
while time.monotonic() - t < 0.5:
    pass
from reasonrl.bench.records import seconds_since_process_start
print(seconds_since_process_start())
"""


def test_counts_from_the_process_start():
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, cwd=REPO,
                         timeout=120).stdout
    wall = time.monotonic() - started
    seen = float(out.strip())
    assert 0.5 <= seen <= wall + 0.02  # /proc's start time is in clock ticks (10 ms)
