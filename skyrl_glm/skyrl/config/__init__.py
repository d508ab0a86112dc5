"""What is read and checked before a run starts: one line naming the key for every problem, before Ray starts.

    sections.py        the ``skyrl_glm`` sections (SyncSection, CheckSection, GlmSection) and GlmTrainConfig
    recipes.py         the one recipe loader: YAML with ``base:``, ``key=value`` overrides, the typed config
    validation.py      a built config checked whole: combinations, value ranges, recipe rules, SkyRL's validate_cfg
    value_ranges.py    SkyRL values SkyRL takes at any value but that fail only after the run started
    recipe_rules.py    the recipe's promises: layout vs stated hardware, sampler-ignored targets, overlong buffer
    hardware.py        ``skyrl_glm.hardware`` and the GPUs a layout asks for
    overlong.py        ``skyrl_glm.overlong``: DAPO's soft overlong penalty
    key_placement.py   where a multi-node run's control key must live
    placement.py       the nodes a config's trainer ranks and engines land on, and each engine's route (dry run)

Imports ``compat`` and ``workers`` of ``skyrl_glm.skyrl``, never ``run``.
"""
