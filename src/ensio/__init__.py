"""ensio: high-throughput ensemble data assimilation for Earth-system models.

``ensio.assimilate(ensemble, observations, analysis_config)`` is the in-memory
entry point (no files, one process); ``ensio.offline.run_analysis`` and the
``ensio`` command cover files and MPI.
"""

from .analysis.filters import assimilate

__version__ = "0.1.0"

__all__ = ["__version__", "assimilate"]
