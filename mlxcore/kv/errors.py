"""Typed errors of the KV caches.

Each one means the cache refused an operation and changed nothing, so the
caller can recover (rebuild the cache by prefill, free a session, ...).
"""

from mlxcore.errors import MlxchatError


class KVCacheError(MlxchatError):
    """Base of every KV cache error."""


class PoolExhaustedError(KVCacheError):
    """The paged block pool has no free block left for the tokens asked for."""


class CacheShapeError(KVCacheError):
    """Keys or values do not have the shape or dtype the cache holds."""


class UnknownSequenceError(KVCacheError):
    """A paged operation named a sequence the pool does not hold (released or never made)."""


class TrimError(KVCacheError):
    """A trim (rewind) that cannot remove exactly the tokens asked for."""


class CacheStateError(KVCacheError):
    """An operation out of order: a forward pass without ``begin``, or a state that does not fit."""
