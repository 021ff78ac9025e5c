"""Node-local directories (imports the rooms below; the shuffle mode reads through it).

``placemap`` (which file goes to which node-local directory), ``placenode``/
``placecopy`` (the verified node-local copies ``ensio stage in/out`` runs: a
:class:`~ensio.io.node.placecopy.CopySet` per node), ``backup``/
``backupworker`` (the background backup of tiles to the global file system,
one :class:`~ensio.io.node.backupworker.BackupAttempt` per cycle). The CLI
command keeps the name ``ensio stage``; in the code "stage" means only a
transaction's staged files (:mod:`ensio.io.txn.staging`).
"""
