"""The metadata pass over the members, before any data moves (imports formats).

``members`` (per-member metadata, the layout), ``consistency`` (across
members), ``quickcheck``/``bytecheck`` (the quick path for many members),
``tilescan`` (tiled members), ``tileplace`` (each tile's place in the grid, in
every member and every I/O mode), ``slotstates`` (4-D time slots),
``memberfiles`` (which files an ensemble is).
"""
