"""Errors the engine raises for bad snapshots and bad requests.

Each carries a message written for the person who has to fix it: what is wrong, and where.
"""


class EngineError(Exception):
    """Base class of every error the engine raises on purpose."""


class SnapshotError(EngineError):
    """A model snapshot is missing, malformed, or does not match the expected layout."""


class InvalidRequestError(EngineError):
    """A synthesis request cannot be served as given (unknown language, empty text, ...)."""
