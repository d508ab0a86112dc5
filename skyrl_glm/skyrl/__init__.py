"""skyrl-glm inside SkyRL 0.4's training loop: the glue above every other domain (nothing below imports it).

    the config
    config.py          the ``skyrl_glm`` sections (SyncSection, CheckSection, GlmSection) and GlmTrainConfig
    recipes.py         the one recipe loader: YAML with ``base:``, ``key=value`` overrides, the typed config
    validation.py      a built config checked whole: combinations, value ranges, recipe rules, SkyRL's validate_cfg
    value_ranges.py    SkyRL values SkyRL takes at any value but that fail only after the run started
    recipe_rules.py    the recipe's promises: layout vs stated hardware, sampler-ignored targets, overlong buffer
    hardware.py        ``skyrl_glm.hardware`` and the GPUs a layout asks for
    overlong.py        ``skyrl_glm.overlong``: DAPO's soft overlong penalty
    key_placement.py   where a multi-node run's control key must live
    placement.py       the nodes a config's trainer ranks and engines land on, and each engine's route (dry run)
    the run
    run.py             one training run from a command line (both doors of ``skyrl_glm.train``)
    experiment.py      GlmPPOExp: SkyRL's BasePPOExp with the registry's workers and the worker extension
    trainer.py         GlmPPOTrainer: sync settings to the workers, the handoff check after the syncs
    check_live.py      the check's trainer, sampler and publisher on the live run
    summary.py         RunSummary: what a run did, written as skyrl_glm_summary.json
    step_log.py        each step's reward and timers into the summary (a SkyRL callback)
    mismatch_log.py    each step's trainer/sampler mismatch into the summary (a SkyRL callback)
    step_table.py      the per-step table and reward PNG from run summaries
    run_log.py         everything to a log file, progress lines to the terminal
    ports.py           each run's own vLLM server and router ports
    cpu.py             CPU mode (``skyrl_glm.cpu=true``), never implicit
    flash_attn_stub.py a pure-torch ``flash_attn.bert_padding`` where flash-attn is missing
    the sync inside SkyRL
    worker_sync.py     the strategy-independent half of a policy worker that syncs through skyrl-glm
    fsdp.py            the FSDP policy worker
    megatron.py        the Megatron policy worker, the export deduplicated as it streams
    routes.py          each engine's transport from where it runs (node-local to rank 0's node, else collective)
    publish.py         SkyRLServers: SkyRL's servers as the publisher's receiving side, each over its route
    sync_group.py      the trainer<->vLLM group of the collective transport
    vllm_extension.py  the worker extension SkyRL's servers load: SkyRL's plus skyrl-glm's receiver
    signed_client.py   SkyRL's clients sign their control calls with the run key
    plugin.py          what the glue registers: worker classes per strategy, the check's ``vllm-skyrl`` sampler
    commands
    cli.py             ``skyrl-glm train``
    recipes_cli.py     ``skyrl-glm recipes`` and ``train --dry-run``

This ``__init__`` imports nothing: import the submodule you need.
"""
