"""LoRA adapter layouts, from config shapes and the trainer's tensors (no Bridge import, nothing allocated).

    bridge.py        the Megatron-Bridge adapter export, described from a config's shapes
    sizes.py         public vs unique size of an adapter
    experts.py       PEFT's fused routed-expert LoRA as vLLM's per-expert names (views)

This ``__init__`` imports nothing.
"""
