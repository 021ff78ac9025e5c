"""ensio: high-throughput ensemble data assimilation for Earth-system models."""

__version__ = "0.1.0"
