"""Direct transfer between separately launched programs (seed 004).

An ``LD_PRELOAD`` interposer (``csrc/``) gives a producer's matching files memory
(memfd) registered with a per-host staging daemon (:mod:`.daemon`, its state in
:mod:`.table`), and a consumer's open a read-only descriptor of that memory, so
unmodified programs (a model, CDO, NCO, ``ensio analyse``) exchange netCDF files
without the file system. ``ensio run`` (:mod:`.run`) builds the interposer
(:mod:`.build`), starts the daemon when absent (:mod:`.runtime`) and starts the
program under it. The message format shared with the C side is :mod:`.protocol`; the
config is :mod:`.config`.

This is the single-host, synchronous foundation. Where the rest extends it:

* cross-host streaming: a second listener in :mod:`.daemon` (TCP on the configured
  interface, authenticated by the experiment's secret) and verbs in :mod:`.protocol`;
  :meth:`.table.Table.complete` is where a completed file is handed to the remote
  daemons the connection's ``pattern`` names, and :meth:`.table.Table.open` where an
  absent file is pulled on demand (all-to-all). On one host every pattern is the same.
* async mode: the rules file gains the connection's mode; dirty-range tracking adds
  ``write``/``pwrite`` wrappers in ``csrc/ensio_interpose.c`` for descriptors in its
  ``fdmap`` and a ``RANGES`` verb; on one host ``async`` behaves as ``sync`` (the
  memory is shared, nothing is sent).
* ``workflow.transfer`` in ``ensio cycle``: :func:`.run.prepare` returns the
  environment a member command needs; a driver adds it to each job's environment.
* ``ensio bench transfer``: drives :func:`.run.prepare` and :class:`.protocol.Client`.

Imports: config (the key-error helpers), durable, errors (DESIGN.md: transfer →
config, durable; errors is the bottom layer).
"""
