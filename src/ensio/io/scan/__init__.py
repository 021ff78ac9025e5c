"""The metadata pass over the members before any data moves: per-member metadata and
the layout (members), consistency across members (consistency), the quick checks
(quickcheck, bytecheck), tiled members (tilescan), 4-D time slots (slotstates). Imports
formats only."""
