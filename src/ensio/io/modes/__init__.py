"""The ensemble-I/O object of each `io.mode`: the common interface and factory
(ensemble), files mode (files, rewrite), tiled files (tiledio), shuffle mode (shuffle,
shuffleplan), the double-buffered pipeline (pipeline), the I/O statistics (stats).
Imports every room below."""
