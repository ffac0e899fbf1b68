"""Errors of the local cluster's operations."""

from __future__ import annotations

from atlas.core.errors import AtlasError


class ClusterError(AtlasError):
    """The local Elasticsearch node could not be fetched, configured, started or stopped."""
