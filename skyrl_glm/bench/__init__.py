"""``skyrl-glm bench sync`` and the process harnesses the tests and the benchmark share (not on the product path).

    cli.py           the ``bench sync`` parser (built without torch) and command
    synthetic.py     BenchOptions; a synthetic Megatron-Bridge-shaped adapter of a registered model family
    sides.py         Sender / Receiver of one benchmarked sync (SkyRL 0.4.0's path, ours, disk); verify_rebuilt
    run.py           the protocol: rounds per path, disk baseline, one or two processes; run_sync_bench
    report.py        stage medians, the rich table, the plot
    procs.py         free_port, the JSON control channels (TCPStore values split under its 8 MiB limit)
    load.py          ``bench load``: vLLM's load stage, tiny (memory vs disk) or full width on a GPU
    load_layouts.py  ``bench load --layouts``: the routed-expert serving layouts side by side, fit to 75 layers, slots
    roundtrip.py     transfer_roundtrip: one sync between two processes, rebuilt bit-exactly (transport tests)
    verify.py        bit-exact comparison of a received adapter with what was sent (the one place bytes are compared)
    routing_run.py   run_routed_sync: EP sender ranks -> TP receiver ranks in processes (the routing experiment)

This ``__init__`` imports nothing.
"""
