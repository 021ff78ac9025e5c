"""Node-local directories (imports the rooms below; the shuffle mode reads through it).

``stagemap`` (which file goes to which directory), ``stagenode``/``stagecopy``
(``ensio stage in/out``), ``backup``/``backupworker`` (the background
backup of tiles to the global file system).
"""
