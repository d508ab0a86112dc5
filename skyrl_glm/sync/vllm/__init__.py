"""The vLLM side of the sync: the receiver inside vLLM and the samplers that own an engine.

    versions.py      LoraVersions: which LoRA ids serve, the update protocol as engine operations; drive()
    engine.py        VllmEngineSampler (offline ``vllm.LLM``), engine_settings, scoring helpers
    engine_env.py    the environment variables an engine reads on GPU (memory share, fixed KV cache), parsed
    async_engine.py  AsyncVllmEngineSampler (``AsyncLLM``): swaps while requests run, deferred removal
    worker.py        LoraSyncWorkerExtension: ``worker_extension_cls``, reached by ``collective_rpc``
    shared_factors.py the shared-all and grouped expert layouts' LoRA slots and expert-to-group map (a patch the
                     vLLM plugin installs, on per engine)
    expert_views.py  the per-expert layout's packed factors as views of the received update (a patch, always on)

``engine``, ``async_engine`` and ``worker`` import vLLM (lazily or at module scope); this ``__init__`` imports
nothing, and the sync core (``skyrl_glm.sync.*`` outside this package) never imports it.
"""
