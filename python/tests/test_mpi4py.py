"""tutti.Communicator.from_mpi over mpi4py's communicators, under Open MPI's mpirun (3
ranks): the world's allreduce against MPI's own, and a split of it (MPI_Comm_split by
parity) made into its own tutti communicator. Skipped where mpi4py or mpirun is missing
(run.sh installs python3-mpi4py and openmpi-bin)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

SCRIPT = r'''
import os
import numpy as np
from mpi4py import MPI
import tutti

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
c = tutti.Communicator.from_mpi(world, timeout_ms=20000)
assert (c.rank, c.size) == (rank, size), (c.rank, c.size)
a = np.arange(1000, dtype=np.float64) * (rank + 1)
want = np.empty_like(a)
world.Allreduce(a, want, op=MPI.SUM)
c.allreduce(a)
assert np.array_equal(a, want), (a[:4], want[:4])
half = world.Split(rank % 2, key=-rank)
h = tutti.Communicator.from_mpi(half, timeout_ms=20000)
assert (h.rank, h.size) == (half.Get_rank(), half.Get_size())
b = np.array([rank], np.int64)
order = np.zeros(h.size, np.int64)
h.allgather(b, order)
assert order.tolist() == sorted([r for r in range(size) if r % 2 == rank % 2], reverse=True), order
h.destroy()
c.destroy()
half.Free()
os.write(1, b"rank %d ok\n" % rank)  # one write: mpirun interleaves print's two
'''


def test_from_mpi_under_mpirun(tmp_path):
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed (python3-mpi4py)")
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("mpirun is not installed (openmpi-bin)")
    script = tmp_path / "from_mpi.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    for k in list(env):  # nothing of a launcher around the test
        if k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_")) or k in (
                "TUTTI_RANK", "TUTTI_WORLD_SIZE", "TUTTI_STORE", "TUTTI_JOB_ID"):
            del env[k]
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl="self,tcp",
               TUTTI_SOCKET_IFNAME="lo", TMPDIR=str(tmp_path))
    p = subprocess.run([mpirun, "-np", "3", sys.executable, str(script)], env=env,
                       capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    # mpirun forwards each rank's output as it reads it, so lines of different ranks may
    # still run together: count the marks, not the lines
    assert sorted(re.findall(r"rank (\d+) ok", p.stdout)) == ["0", "1", "2"], out
