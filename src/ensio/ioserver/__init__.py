"""Asynchronous I/O server with online post-processing (issue 11).

Model ranks send fields to dedicated server ranks (or, in attached mode, post-process
them themselves); a graph built once from the ``ioserver`` config section applies time
operations (:mod:`.timeops`), expressions (:mod:`.expr`) and spatial operations, and the
writer produces CF-1.8 netCDF files.
"""
