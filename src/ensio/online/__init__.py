"""Online (coupled) mode: the members' models and the filter in one MPI job.

``Ensemble`` is the model-side API (:mod:`ensio.online.ensemble`); the filter
side (:mod:`ensio.online.filter`) runs the offline analysis on the gathered
blocks; :mod:`ensio.online.failure` ends the job cleanly when a rank fails;
:mod:`ensio.online.cycling` keeps the run directory of ``ensio cycle --mode
online``. The example coupled programs built on it live in :mod:`ensio.models`
(``ensio model l96-coupled``, ``ensio model synthetic-coupled``).
"""

from .ensemble import Ensemble, OnlineError, OnlineReport

__all__ = ["Ensemble", "OnlineError", "OnlineReport"]
