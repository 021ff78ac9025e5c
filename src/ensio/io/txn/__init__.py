"""Crash safety of every writer (imports formats and scan; the lock is :mod:`ensio.locks`).

``transaction`` (the one protocol every writer joins: begin, stage,
checkpoint, commit, abort, recover), ``marker`` (the one marker writer and
reader), ``undolog``, ``journal``, ``staging`` (staged and partial names, the
one roll-forward), ``commit`` (the committed write of a run),
``librarycopy`` (a journaled rewrite through a copy), ``runrecord``/
``runsfile`` (what was analysed), ``shufflejournal``/``shufflecommit`` (the
shuffle mode's transaction across node-local directories).
"""
