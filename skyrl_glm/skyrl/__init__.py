"""skyrl-glm inside SkyRL 0.4's training loop: the glue above every other domain (nothing below imports it).

Arranged by where the code runs; each group imports only the groups listed before it (tests/test_layering.py):

    compat/    CPU mode and stand-ins: what a process needs lifted before SkyRL, vLLM or Megatron-Bridge import
    workers/   inside SkyRL's Ray actors and vLLM servers: the policy workers' sync, the servers' receiving side
    config/    read and checked before a run: the ``skyrl_glm`` sections, recipes, the checks of a whole config
    run/       the driver process: one training run, its trainer hook, live check, record and log
    cli.py          ``skyrl-glm train``
    recipes_cli.py  ``skyrl-glm recipes`` and ``train --dry-run``
    plugin.py       what the glue registers: worker classes per strategy, the check's ``vllm-skyrl`` sampler

This ``__init__`` imports nothing: import the submodule you need.
"""
