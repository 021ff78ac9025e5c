"""Direct transfer between separately launched programs (seed 004).

An ``LD_PRELOAD`` interposer (``csrc/``) gives a producer's matching files memory
(memfd) registered with a per-host staging daemon (:mod:`.daemon`), and a
consumer's open a read-only descriptor of that memory, so unmodified programs
(a model, CDO, NCO, ``ensio analyse``) exchange netCDF files without the file
system. ``ensio run`` (:mod:`.run`) builds the interposer, starts the daemon when
absent and starts the program under it. The message format shared with the C side
is :mod:`.protocol`.
"""
