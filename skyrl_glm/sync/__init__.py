"""The in-memory LoRA sync: trainer adapter stream -> plan -> transport -> receiver -> vLLM engine.

One update, end to end: the trainer's ``(public name, tensor)`` stream is planned (alpha folded into B, exact
dedup, packed layout, JSON manifest with checksums), its unique bytes move over a transport, and the receiver
verifies them against the manifest, rebuilds every public name in private memory and hands the adapter to the
engine, which swaps it in atomically. A rejected update leaves the previous adapter serving.

    trainer side
    plan.py          build_plan: fold, dedup, packed stream layout, manifest (SyncPlan)
    dedup.py         exact dedup: one sent tensor per value, every public name that shows it; the stream read in parts
    publisher.py     InMemoryPublisher (the one publisher: library, check, SkyRL) and DiskPublisher (the baseline)
    both sides
    manifest.py      Manifest / TensorEntry: the JSON that says exactly what an update holds
    aliases.py       AliasRun rules (expert-index ranges) for the alias map; NameIndex checks them without expanding
    checksum.py      checksums + NaN/inf per tensor, dedup's fingerprints (one Triton kernel on CUDA, numpy elsewhere)
    compare.py       byte equality of many tensor pairs in one launch (the sender's dedup proofs)
    copy_table.py    many byte copies in one launch through a table of addresses (the sender's pack on a GPU)
    nogc.py          the cyclic GC paused around one planning or receiving step
    update.py        UpdateResult, the Sampler and AsyncSampler protocols: what a publisher drives, engine-free
    transports/      the Transport contract and the named transports (shm, nccl, cuda_ipc)
    sampler side
    receiver.py      AdapterReceiver: validate, stage, verify, rebuild public names (torch only)
    staging_pool.py  a gone version's staging memory and the tensors made of it, kept for the next update of its layout
    expert_layout.py the routed experts' serving layout (per-expert, stacked-3d, shared-outer): engine arguments, build
    vllm/            the vLLM glue: update protocol, offline and async samplers, the worker extension

This ``__init__`` imports nothing, so importing a light module (``manifest``) never pulls torch-heavy or
vLLM modules in; import each module where it is used. Nothing outside ``vllm/`` imports vLLM.
"""
