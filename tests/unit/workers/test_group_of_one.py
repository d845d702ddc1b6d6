"""``reasonrl.workers.distributed.init_distributed`` for a group of one: it rendezvouses in memory, so the port it is
handed may be taken (a free port picked ahead of time can be, by any process, before a TCP store binds it: the
thirty-first session's CI lost a test to ``EADDRINUSE`` that way). Run in a child process: the test process may hold
a default group already."""
import subprocess
import sys

CHILD = """
import socket, torch, torch.distributed as dist
from reasonrl.workers.distributed import init_distributed
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen(1)
mesh = init_distributed(0, 1, "127.0.0.1", taken.getsockname()[1], "cpu")
t = torch.ones(2)
dist.all_reduce(t)
print(dist.get_world_size(), mesh.size(), t.tolist())
"""


def test_a_group_of_one_starts_on_a_port_another_process_holds():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[-2] == "1 1 [1.0, 1.0]"
