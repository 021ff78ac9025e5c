"""The metadata pass over the members, before any data moves (imports formats).

``members`` (per-member metadata, the layout), ``consistency`` (across
members), ``quickcheck``/``bytecheck`` (the quick path for many members),
``tilescan`` (tiled members), ``slotstates`` (4-D time slots),
``memberfiles`` (which files an ensemble is).
"""
