"""Shared by the mpi-label tests: symprune_dist under a real mpirun (root allowed, oversubscribed)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from prune_support import Stories  # noqa: E402

DIST = os.environ["SYMPRUNE_DIST_BIN"]
# symprune_dist linked with the CPU emulation of CUDA: `--device cuda` runs the device pipeline on the CPU.
DIST_EMULATED = os.environ.get("SYMPRUNE_DIST_EMULATED_BIN", "")
MPIEXEC = os.environ.get("SYMPRUNE_MPIEXEC", "mpirun")


# What mpirun needs here beside the caller's environment (more ranks than the machine's cores).
MPI_ENV = {"OMPI_MCA_rmaps_base_oversubscribe": "1"}


def launcher(ranks, binary=DIST):
    """The command line before the program's options: symprune_dist (or `binary`) on `ranks` processes."""
    return [MPIEXEC, "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", binary]


def mpirun(ranks, *args, env=None, timeout=300, binary=DIST):
    """symprune_dist (or `binary`) on `ranks` processes; CompletedProcess with text output."""
    command = [*launcher(ranks, binary), *map(str, args)]
    full_env = {**os.environ, **MPI_ENV, **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.fixture(scope="session")
def stories(tmp_path_factory):
    return Stories(tmp_path_factory.mktemp("stories"))


@pytest.fixture(scope="session")
def have_mpirun():
    if shutil.which(MPIEXEC) is None:
        pytest.skip(f"{MPIEXEC} not found")
