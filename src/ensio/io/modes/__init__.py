"""The ensemble-I/O object of each ``io.mode`` (imports every room below).

``base`` (the ``EnsembleIO`` ABC: the I/O and the run hooks of the one
analysis driver, ``ensio.offline``), ``ensemble`` (the one registry
``ENSEMBLE_IO`` and the factory), ``files``/``rewrite`` (files mode),
``tiledio`` (tiled files, opened by files mode), ``shuffle``/``shuffleplan``
(the group all-to-all) and ``shufflerun`` (the shuffle mode's run: lock root,
rerun check, two-phase commit), ``pipeline`` (the double-buffered read/write
loop), ``stats``, ``copies`` (byte copies of members for ``io.in_place: false``).
"""
