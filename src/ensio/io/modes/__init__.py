"""The ensemble-I/O object of each ``io.mode`` (imports every room below).

``base`` (the ``EnsembleIO`` ABC: the I/O and the run hooks of the one
analysis driver, ``ensio.offline``), ``ensemble`` (the one registry
``ENSEMBLE_IO`` and the factory), ``files``/``rewrite`` (files mode),
``tiledio`` (tiled files, opened by files mode), ``shuffle``/``shuffleplan``/
``shuffletile`` (the group all-to-all; the mode's class) and ``shufflerun``
(the bodies of its run hooks: lock root, rerun check, two-phase commit),
``pipeline`` (the double-buffered read/write loop), ``stats``, ``copies``
(byte copies of members for ``io.in_place: false``).
"""
