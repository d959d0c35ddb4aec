"""KV caches: the per-layer protocol, and the kinds mlxchat offers (standard, paged, rotating).

- ``protocol.py``: ``LayerCache``, what mlx-lm's models call on each layer's cache.
- ``model_cache.py``: ``make_model_cache`` and ``ModelCache`` (``base.py``), the API the engine uses.
- ``standard.py``: mlx-lm's ``KVCache``.
- ``block_manager.py`` (bookkeeping, no tensors), ``paged_pool.py`` (the pool, its budget and slabs),
  ``slab_storage.py`` (a layer's MLX storage, read as views per run of blocks), ``paged.py`` (the kind).
- ``window.py`` (slot and mask arithmetic), ``rotating.py`` (the kind).
- ``budget.py``: the KV memory budget in bytes (``--max-kv`` sizes, the machine's default, the shared account).
- ``errors.py``: typed errors. ``geometry.py``: a model's KV shape.
"""
