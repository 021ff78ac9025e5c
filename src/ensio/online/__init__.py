"""Online (coupled) mode: the members' models and the filter in one MPI job.

``Ensemble`` is the model-side API (:mod:`ensio.online.ensemble`); the filter
side (:mod:`ensio.online.filter`) runs the offline analysis on the gathered
blocks; :mod:`ensio.online.failure` ends the job cleanly when a rank fails;
``python -m ensio.online.l96`` runs the Lorenz-96 example coupled.
"""

from .ensemble import Ensemble, OnlineError, OnlineReport

__all__ = ["Ensemble", "OnlineError", "OnlineReport"]
