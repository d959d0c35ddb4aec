"""Continuous batching: several requests decode together on the paged pool, scheduled step by step.

- ``request.py``: what a caller asks for (``Request``, ``Priority``).
- ``handle.py``: what a caller gets back (``RequestHandle``: the request's events, from any thread).
- ``policies.py``: the order requests are served in, and who is preempted (tensor-free).
- ``scheduler.py``: one step's plan: who decodes, who prefills how much, who is preempted (tensor-free).
- ``batch_forward.py``: the batched decode forward pass over the sequences' block tables.
- ``runner.py``: carries out the plans on the engine's models and caches (all MLX work).
- ``worker.py``: runs the steps on one thread; other threads submit requests and read their events.
"""
