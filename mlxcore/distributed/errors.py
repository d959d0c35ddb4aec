"""Errors of a run over several ranks, each with a message for the user."""

from __future__ import annotations

from mlxcore.errors import MlxchatError, ModelLoadError

LOST_PEER_MARKERS = ("[ring]", "[jaccl]", "[mpi]")  # how MLX's backends begin their messages


class DistributedError(MlxchatError):
    """The ranks of a distributed run cannot work together."""


class ShardingError(ModelLoadError):
    """The model cannot be split over this many ranks (heads or MLP width not divisible, no ``shard()``)."""


class RankMismatchError(DistributedError):
    """Another rank runs another model, draft, KV setting or mlxchat version."""


class RankLostError(DistributedError):
    """A rank stopped (killed, crashed, its machine gone): the others stop too."""

    #: every surviving rank says so (other errors are the same on every rank, so only rank 0 prints them)
    every_rank_reports = True


def is_lost_peer(error: BaseException) -> bool:
    """Whether ``error`` is MLX telling that a collective's peer went away."""
    return isinstance(error, RuntimeError) and any(marker in str(error) for marker in LOST_PEER_MARKERS)


def lost_peer(error: BaseException, rank: int, size: int) -> RankLostError:
    return RankLostError(f"rank {rank} of {size}: another rank of this run stopped ({error}); stopping too. "
                         "Its own output says why (killed, out of memory, its machine gone).")
