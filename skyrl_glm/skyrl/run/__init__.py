"""The driver process of one training run.

launch.py          one training run from a command line (both doors of ``skyrl_glm.train``)
experiment.py      GlmPPOExp: SkyRL's BasePPOExp with the registry's workers and the worker extension
trainer.py         GlmPPOTrainer: sync settings to the workers, the handoff check after the syncs
check_live.py      the check's trainer, sampler and publisher on the live run
summary.py         RunSummary: what a run did, written as skyrl_glm_summary.json
step_log.py        each step's reward and timers into the summary (a SkyRL callback)
mismatch_log.py    each step's trainer/sampler mismatch into the summary (a SkyRL callback)
run_log.py         everything to a log file, progress lines to the terminal
ports.py           each run's own vLLM server and router ports
"""
