"""The canary: a reward a tiny random-weight model learns in a few GRPO steps, to prove a loop learns through
its sync (``env``: the skyrl_gym env ``glm_canary``; ``curves``: reward per step from run summaries, table and PNG)."""
