import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def pytest_runtest_setup(item):
    # SLURM tests skip without a cluster, and fail with the reason when CI=true.
    if item.get_closest_marker("slurm") is not None:
        from pool_support import require_slurm

        require_slurm()
