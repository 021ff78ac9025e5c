"""Tiled members: tile geometry and the global grid (tiled), reading and writing one
tile file (tilefile, tileread, tilerewrite), cutting tiles (tilecut), tile-shaped
products (tileproducts). Imports formats, scan, txn."""
