"""Measurement, in one home: the rows of `mlxchat bench` (DESIGN.md's Measures, each a ratio from one run),
the twins (random-weight models with the users' geometry), the load generator, and the one-off studies behind
docs/decisions.md (``studies/``).

It sits above the product: it imports ``mlxcore``, ``sessions`` and ``app``, and nothing in them imports it
(tests/test_architecture.py), but for the command line handing `mlxchat bench` to ``bench.command``.
"""
