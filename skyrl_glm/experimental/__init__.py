"""Experiments: working, tested code that no product path calls yet, kept apart so the product's layering stays
true. Nothing outside ``experimental`` and ``bench`` imports it (``tests/test_layering.py``).

    routing/         multi-rank sync: EP-sharded trainer ranks -> TP-sharded vLLM ranks (plan, routed transport)

This ``__init__`` imports nothing.
"""
