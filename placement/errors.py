"""The one exception the planner raises for bad input."""

from __future__ import annotations


class PlacementError(ValueError):
    """Bad input (model, cluster, request or command); the message names what is wrong."""
