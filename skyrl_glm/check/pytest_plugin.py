"""pytest plugin (entry point ``pytest11``): run the handoff check on your own trainer/sampler pair.

    def test_handoff(handoff_check):
        handoff_check.assert_passes(trainer, sampler, publisher)

``trainer``/``sampler`` follow :mod:`skyrl_glm.check.algorithm`'s scorer protocols; ``publisher`` is your
real sync path. Tests using the fixture are marked ``handoff`` (select with ``-m handoff``).
"""

from __future__ import annotations

from typing import Any

import pytest

from skyrl_glm.check.algorithm import CheckConfig, CheckReport, run_check
from skyrl_glm.check.probes import Probes, make_probes


class HandoffChecker:
    def run(
        self,
        trainer: Any,
        sampler: Any,
        publisher: Any,
        *,
        probes: Probes | None = None,
        vocab_size: int = 512,
        **config: Any,
    ) -> CheckReport:
        return run_check(trainer, sampler, publisher, probes or make_probes(vocab_size), CheckConfig(**config))

    def assert_passes(self, trainer: Any, sampler: Any, publisher: Any, **kwargs: Any) -> CheckReport:
        report = self.run(trainer, sampler, publisher, **kwargs)
        fail = report.first_failure
        assert report.passed, (
            f"handoff check FAIL at step {fail.step} ({fail.name}): {fail.detail}"
            if fail
            else ("handoff check incomplete")
        )
        return report


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "handoff: runs the skyrl-glm five-step handoff check")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "handoff_check" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.handoff)


@pytest.fixture
def handoff_check() -> HandoffChecker:
    return HandoffChecker()
