"""Running one model over several processes (machines) with ``mlx.distributed``.

Every rank runs the same program on its share of the target's weights and KV
heads (mlx-lm's tensor-parallel ``shard()``); the draft is whole on every rank.
Rank 0 owns the user interface: what comes from outside (a prompt, a file, an
HTTP request, the clock a decision reads) is read on rank 0 and shared, so the
other ranks take the same steps. See README, "Several machines".
"""
