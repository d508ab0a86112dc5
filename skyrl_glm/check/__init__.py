"""The five-step handoff check: trainer and sampler agree, a perturbation the stale sampler must see, agreement
again after the real sync.

    algorithm.py     run_check and CheckConfig: the five steps over the Trainer / Sampler / Publisher protocols
    probes.py        the fixed, seeded token set the check scores
    faults.py        FAULT_TABLE: deliberately broken handoffs, each with the step that must catch it
    scorers.py       the built-in factories: ``hf`` trainer, ``vllm`` sampler (registered by entry point)
    trainer_hf.py    HfPeftTrainer: the HF + PEFT reference policy
    runner.py        a check assembled from names (model, trainer, sampler, transport, fault)
    report.py        the rich table, JSON and the per-token plot
    matrix.py        every (transport, fault) check on one engine, one verdict (``check matrix``)
    cli.py           ``skyrl-glm check``
    pytest_plugin.py the ``pytest11`` plugin: the check on your own trainer/sampler pair

This ``__init__`` imports nothing.
"""
