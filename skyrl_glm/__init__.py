"""skyrl-glm: GLM-5.3 / GLM-5.3-Flash LoRA RL for SkyRL.

Public API (see docs/api.md): :func:`skyrl_glm.plugins.registry` for what is registered,
:mod:`skyrl_glm.sync` for the adapter handoff, :mod:`skyrl_glm.check` for the five-step check.
"""

from skyrl_glm.quiet import import_notes_off

__version__ = "0.1.0"

import_notes_off()
