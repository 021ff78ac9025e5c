"""ensio: high-throughput ensemble data assimilation for Earth-system models.

``ensio.assimilate(ensemble, observations, analysis_config)`` is the in-memory
entry point (no files, one process); ``ensio.offline.run_analysis`` and the
``ensio`` command cover files and MPI.

The package namespace is lazy: ``import ensio`` imports no numerical module,
so light processes (pool workers, the ``ensio`` command) start fast.
"""

from __future__ import annotations

TYPE_CHECKING = False  # importing typing costs every ``ensio`` command ~15 ms
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "assimilate"]


def __getattr__(name: str) -> Any:
    if name == "assimilate":
        from .analysis.api import assimilate

        return assimilate
    raise AttributeError(f"module 'ensio' has no attribute {name!r}")
