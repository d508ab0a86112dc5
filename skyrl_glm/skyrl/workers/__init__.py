"""Code that runs inside SkyRL's Ray actors and vLLM servers: no config or run module is imported here.

    worker_sync.py     the strategy-independent half of a policy worker that syncs through skyrl-glm
    fsdp.py            the FSDP policy worker
    megatron.py        the Megatron policy worker, the export deduplicated as it streams
    routes.py          each engine's transport from where it runs (node-local to rank 0's node, else collective)
    publish.py         SkyRLServers: SkyRL's servers as the publisher's receiving side, each over its route
    sync_group.py      the trainer<->vLLM group of the collective transport
    vllm_extension.py  the worker extension SkyRL's servers load: SkyRL's plus skyrl-glm's receiver
    signed_client.py   SkyRL's clients sign their control calls with the run key

Imports only ``compat`` of ``skyrl_glm.skyrl``.
"""
