"""Crash safety of every writer (imports formats and scan; the lock is :mod:`ensio.locks`).

``undolog``, ``journal``, ``staging``, ``commit`` (the committed
write of a run), ``librarycopy`` (a journaled rewrite through a copy),
``runrecord``/``runsfile`` (what was analysed), ``shufflejournal``/
``shufflecommit`` (the shuffle mode's transaction across node-local directories).
"""
