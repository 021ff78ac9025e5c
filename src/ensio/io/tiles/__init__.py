"""Tiled members: tile geometry and tile files (imports formats, scan, txn).

``tiled`` (the global grid of P tiles), ``tilefile``/``tileread``/
``tilerewrite`` (one tile file), ``tilecut`` (cutting tiles),
``tileproducts`` (tile-shaped product files).
"""
