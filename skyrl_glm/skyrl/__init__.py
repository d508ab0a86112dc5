"""skyrl-glm inside SkyRL 0.4's training loop: config section, experiment, workers, sync, check hook, CPU mode.

Import the submodule you need (``skyrl_glm.skyrl.config`` ...): this package imports nothing heavy itself.
"""
