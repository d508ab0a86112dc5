"""CPU mode and stand-ins: what a process needs lifted before SkyRL, vLLM or Megatron-Bridge import.

    cpu.py              CPU mode (``skyrl_glm.cpu=true``), never implicit; its setup hook runs in every Ray worker
    flash_attn_stub.py  a pure-torch ``flash_attn.bert_padding`` where flash-attn is missing
    after_import.py     a patch applied when a module is first imported (shared by CPU mode and the Bridge compat)
    bridge_compat.py    the two functions SkyRL's Megatron wrapper imports from Bridge's repository, for released Bridge
    trainer_stack.py    whether the trainer stack a strategy needs imports, checked before Ray starts

Imports nothing else of ``skyrl_glm.skyrl``.
"""
