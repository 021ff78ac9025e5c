"""Small real models for demos and tests, run as ``ensio model ...``.

:mod:`~ensio.models.lorenz96` and :mod:`~ensio.models.l96case` (Lorenz-96 with
netCDF restarts), :mod:`~ensio.models.synthetic` and
:mod:`~ensio.models.synthrun` (the seed paper's synthetic global field) read
and write files like a user's own model. The functions here take plain
values; the command line is parsed in :mod:`ensio.cli.model`.

Import exception (DESIGN.md: models import only parallel):
:mod:`~ensio.models.l96_coupled` and :mod:`~ensio.models.synthetic_coupled`
are the examples' coupled programs, i.e. *users* of :mod:`ensio.online`. They
live here rather than in ``examples/`` because ``workflow.online.command`` of
the shipped examples runs them as ``ensio model l96-coupled`` and ``ensio model
synthetic-coupled``, which must work from an installed package; they were moved
out of :mod:`ensio.online` so the library room holds no example program.
Nothing in the library imports them (only :mod:`ensio.cli.model`, lazily).
"""
