"""Model families: one record per architecture, one per LoRA target, and what a sampler needs to serve them.

    base.py          ModelFamily, LoraTarget, LoraPolicy: the facts a model adapter tells skyrl-glm
    targets.py       LoRA target building blocks shared by the GLM families
    glm4.py          GLM-4.x: real GLM architectures vLLM's CPU build serves (CPU sampler proxies)
    glm5.py          GLM-5.3 (``glm_moe_dsa``)
    glm5_flash.py    GLM-5.3-Flash (``glm5_next``)
    glm5_vllm_cpu.py GLM-5.3 on vLLM's CPU build as dense MLA
    builtin.py       the built-in families, registered by entry point
    vllm_targets.py  a family's vLLM engine kwargs and the sampler backend its targets are checked against
    tiny.py          tiny random-weight checkpoints, made locally and deterministically
    tiny_cache.py    tiny checkpoints kept between runs, keyed by family and seed
    tokenizer.py     a small real tokenizer for tiny checkpoints
    cli.py           ``skyrl-glm models``, ``tiny make`` and ``sizes``

This ``__init__`` imports nothing.
"""
