"""Asynchronous I/O server with online post-processing (seeds 002 XIOS-in-IFS, 003 ESMF).

Model ranks send ``(field, step, part)`` messages into a bounded buffer and go on
computing; dedicated server ranks assemble the global fields, run the
post-processing graph built once from the ``ioserver:`` config (time operations
chained with ``@``, expressions, spatial means) and write CF-1.8 netCDF. The
``attached`` mode runs the same graph on the model ranks, ``sync`` is the
gather-to-rank-0 baseline. C and Fortran models use the same protocol through
``libensio_ioclient`` (``csrc/``).
"""

from .client import Client
from .protocol import IOServerError
from .report import Report
from .start import start

__all__ = ["Client", "IOServerError", "Report", "start"]
