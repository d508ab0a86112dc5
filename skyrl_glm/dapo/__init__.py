"""DAPO-math for GLM: answer extraction and reward env, dataset preparation, eval report.

    answer.py        the final answer a GLM response gives, found in one bounded pass
    verify.py        is an extracted answer the ground truth (exact numbers, math-verify otherwise)
    reward.py        score: +1 for the ground truth, else -1 (``dapo_strict``: DAPO's string reward)
    env.py           ``glm_math``: the skyrl_gym env scored by ``reward.score``
    data.py          DAPO-Math-17k and AIME 2024 into SkyRL's prompt parquet
    report.py        the eval numbers over training steps, from SkyRL's eval dumps
    cli.py           ``skyrl-glm data prepare`` and ``skyrl-glm report``

This ``__init__`` imports nothing.
"""
