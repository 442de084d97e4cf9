"""An example third-party dynlab plugin (used by dynlab's own tests)."""

__version__ = "0.1.0"
