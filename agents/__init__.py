"""layercake node agent: runs on GPU nodes, never imports Django."""

__version__ = "0.1.0"
