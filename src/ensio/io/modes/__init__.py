"""The ensemble-I/O object of each ``io.mode`` (imports every room below).

``ensemble`` (the interface and factory), ``files``/``rewrite`` (files
mode), ``tiledio`` (tiled files), ``shuffle``/``shuffleplan`` (shuffle
mode), ``pipeline`` (the double-buffered read/write loop), ``stats``,
``copies`` (byte copies of members for ``io.in_place: false``).
"""
