"""The door SkyRL itself opens: train with SkyRL 0.4's loop and skyrl-glm's sync and check.

    python -m skyrl_glm.train [RECIPE] key=value ...
    python -m skyrl.train.entrypoints.main_base trainer.override_entrypoint=skyrl_glm.train [key=value ...]

SkyRL's ``main_base`` imports the module an override entrypoint names and calls its ``main()``; the run itself is
:func:`skyrl_glm.skyrl.run.launch.run_command` (the same as ``skyrl-glm train``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry of both doors. Exits itself: SkyRL's main_base drops the return value of an override entrypoint.
    Quiet unless SkyRL's own ``SKYRL_DUMP_INFRA_LOG_TO_STDOUT=1`` asks for every log line on the terminal."""
    from skyrl.env_vars import SKYRL_DUMP_INFRA_LOG_TO_STDOUT as verbose

    from skyrl_glm import quiet
    from skyrl_glm.skyrl.run.launch import run_command

    engine_log = quiet.configure(verbose)
    code = run_command(sys.argv[1:] if argv is None else argv, verbose)
    quiet.finish(engine_log, code)
    sys.exit(code)


if __name__ == "__main__":
    main()
