"""Direct transfer between separately launched programs (seed 004).

An ``LD_PRELOAD`` interposer (``csrc/``) gives a producer's matching files memory
(memfd) registered with a per-host staging daemon (:mod:`.daemon`, its state in
:mod:`.table`), and a consumer's open a read-only descriptor of that memory, so
unmodified programs (a model, CDO, NCO, ``ensio analyse``) exchange netCDF files
without the file system. ``ensio run`` (:mod:`.run`) builds the interposer
(:mod:`.build`), starts the daemon when absent (:mod:`.runtime`) and starts the
program under it; a later launch of the same config and component only checks the
launch record the first one wrote and execs (:mod:`.launch`, before argparse or YAML;
``csrc/ensio_launch.c``, built by :mod:`.launcher`, is the same check without Python).
The message format shared with the C side is :mod:`.protocol`; the
config is :mod:`.config`.

Across hosts (the config's ``hosts``, :mod:`.hosts`): the daemon of each host also
listens on TCP at its configured address (:mod:`.network`), accepting only daemons
that prove the experiment's secret (:mod:`.secret`, :mod:`.wire`). A producer's file
is streamed (:mod:`.outgoing`) to the hosts its connection's ``pattern`` names, where
it becomes a held file like a local one. ``async`` connections send the ranges the
interposer reports (``csrc/ensio_interpose_writes.c``) while the producer runs, and
after its close only what was written again; on one host ``async`` behaves as
``sync`` (the memory is shared, nothing is sent).

Memory: the daemon's held files are in 2 MiB pages where the machine allows it, on a
private tmpfs mounted by a short-lived helper in a mount namespace of its own and
detached at once (:mod:`.hugemem`; ``ENSIO_TRANSFER_HUGE_PAGES=off``: memfds), and
pre-faulted between output bursts and recycled from files that left the table
(:mod:`.pool`). Every file counts against a
budget (its connection's ``memory_mb``, else half the machine's or job's memory);
files every declared consumer has read (its process exited 0) are released first
when a budget needs room (:mod:`.budget`).

Consumers: an open or stat of a name a connection will produce waits until the
producer creates and closes it, or ``consumer_timeout_s``, also when the producer
runs on another host (daemons exchange producer runs over :mod:`.names`'s control
connection); the held names appear in
directory listings, ``glob`` and ``scandir`` (:mod:`.view` answers both; C side
``csrc/ensio_interpose_dirs.c``, ``_glob.c``, ``_xattr.c``).

Launch: the first ``ensio run`` of a config and component writes a launch record and
later launches only check it and exec COMMAND without importing the package
(:mod:`.launch`; the same check in C is ``ensio-launch``, built by :mod:`.launcher`).

Where the rest extends it:

* ``workflow.transfer`` in ``ensio cycle``: :func:`.run.prepare` returns the
  environment a member command needs; a driver adds it to each job's environment.
* ``ensio bench transfer``: drives :func:`.run.prepare` and :class:`.protocol.Client`.
* ``serve_partial``: on a consumer host, a file still arriving from another host is
  opened as soon as its final size is known (the ``SIZE`` frame, :mod:`.wire`); the
  receiving daemon publishes which bytes are final in a shared progress map
  (:mod:`.progress`) and the interposer's reads wait for theirs
  (``csrc/ensio_interpose_partial.c``).

An ``all-to-all`` connection's file absent on a consumer's host is pulled on demand
from the other hosts (a consumer on a host ``hosts`` does not place it on).

Imports: config (the key-error helpers), durable, errors (DESIGN.md: transfer →
config, durable; errors is the bottom layer).
"""
