"""Node-local directories: which file goes where (stagemap), staging in and out
(stagenode, stagecopy), the background backup of tiles to the global file system
(backup, backupworker). Imports the rooms below modes."""
