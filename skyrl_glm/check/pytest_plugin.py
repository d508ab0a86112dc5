"""pytest plugin (entry point ``pytest11``): run the handoff check on your own trainer/sampler pair.

    def test_handoff(handoff_check):
        handoff_check.assert_passes(trainer, sampler, publisher)

What the three objects must offer is :class:`~skyrl_glm.check.algorithm.TrainerScorer`,
:class:`~skyrl_glm.check.algorithm.SamplerScorer` and :class:`~skyrl_glm.sync.update.Publisher` (docs/api.md,
"The check's contract"); ``publisher`` is your real sync path. The probes are token ids in ``8..vocab_size-1``:
the vocabulary size comes from ``vocab_size=``, else from a ``vocab_size`` attribute of the trainer (or sampler);
with neither, or probes past it, the check refuses with
:class:`~skyrl_glm.check.probes.ProbeVocabularyError` before anything is scored. Tests using the fixture are marked
``handoff`` (select with ``-m handoff``).
"""

from __future__ import annotations

from typing import Any

import pytest

from skyrl_glm.check.algorithm import CheckConfig, CheckReport, run_check
from skyrl_glm.check.probes import Probes, ProbeVocabularyError, make_probes


def declared_vocab_size(*sides: Any) -> int:
    """The first ``vocab_size`` a side declares; :class:`ProbeVocabularyError` when none does."""
    for side in sides:
        declared = getattr(side, "vocab_size", None)
        if isinstance(declared, int) and not isinstance(declared, bool):
            return declared
    raise ProbeVocabularyError(
        "the probes need the model's vocabulary size: pass vocab_size=N, or give the trainer a vocab_size attribute"
    )


class HandoffChecker:
    def run(
        self,
        trainer: Any,
        sampler: Any,
        publisher: Any,
        *,
        probes: Probes | None = None,
        vocab_size: int | None = None,
        **config: Any,
    ) -> CheckReport:
        """The five steps on these three; ``probes`` default to :func:`make_probes` over ``vocab_size`` (else
        the trainer's or sampler's ``vocab_size``); ``config``: :class:`CheckConfig` fields."""
        if probes is None:
            probes = make_probes(vocab_size if vocab_size is not None else declared_vocab_size(trainer, sampler))
        return run_check(trainer, sampler, publisher, probes, CheckConfig(**config))

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
