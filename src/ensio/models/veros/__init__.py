"""The Veros OSSE: a real ocean model, run unmodified, assimilated by ``ensio cycle``.

``ensio example veros DIR`` (:mod:`.osse`) sets up the ``acc`` setup of Veros 1.7,
spins it up, runs a truth, draws an initial ensemble and synthetic observations, cycles
the ensemble with the LETKF (each member a ``veros run`` job) beside a free ensemble,
and reports RMSE, spread, O−B/O−A and the timing split as JSON and plots.

Modules: :mod:`.run` (one checked ``veros run``: the member command), :mod:`.prepare`
(set-up, spin-up, grid file, initial ensemble, truth), :mod:`.observe` (observation
files), :mod:`.verify` (statistics against the truth, diag files, timing records),
:mod:`.plots`, :mod:`.osse` (the driver).

Import exception (DESIGN.md: models import only parallel): the driver uses
:mod:`ensio.durable` and :mod:`ensio.errors` (standard library only) and runs
``ensio cycle`` as a command, as a user would; it imports nothing of the workflow or
the analysis. Veros itself is never imported: it is run as the ``veros`` command.
"""
