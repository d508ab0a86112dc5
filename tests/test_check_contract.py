"""The contract a user's trainer and sampler meet (docs/api.md): probes a model cannot score are refused in one line
with :class:`ProbeVocabularyError` before anything is scored (a 100-token toy model used to crash the check with an
IndexError), and the pytest fixture takes the vocabulary from the sides. Toy bigram models stand in for engines
(tests/toy_lora.py: the real plan, transport and receiver path)."""

from __future__ import annotations

import pytest
from toy_lora import ToySampler, ToyTrainer

from skyrl_glm.check.algorithm import CheckConfig, run_check
from skyrl_glm.check.probes import ProbeVocabularyError, make_probes
from skyrl_glm.check.pytest_plugin import HandoffChecker
from skyrl_glm.check.runner import _warm
from skyrl_glm.sync.publisher import InMemoryPublisher
from skyrl_glm.sync.transports.shm import SharedMemoryTransport
from skyrl_glm.usage import UsageError

MODULE = "0.self_attn.q_proj"


class SmallVocabTrainer(ToyTrainer):
    """The toy with a declared vocabulary of 100 ids; records what it was asked to score."""

    vocab_size = 100

    def __init__(self, module: str) -> None:
        super().__init__(module)
        self.scored: list[list[int]] = []

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        self.scored += sequences
        return super().score(sequences)


def _sides() -> tuple[SmallVocabTrainer, ToySampler, InMemoryPublisher]:
    sampler = ToySampler(MODULE)
    return SmallVocabTrainer(MODULE), sampler, InMemoryPublisher(sampler, SharedMemoryTransport())


def test_probes_past_the_vocabulary_are_refused_before_any_scoring():
    trainer, sampler, publisher = _sides()
    with pytest.raises(ProbeVocabularyError) as refused:
        run_check(trainer, sampler, publisher, make_probes(512), CheckConfig(decode=False))
    message = str(refused.value)
    assert "past the trainer's vocabulary of 100 ids" in message and "make_probes(100)" in message
    assert "\n" not in message and isinstance(refused.value, UsageError)  # one line; the CLI's exit 2
    assert trainer.scored == [] and sampler.updates == 0


def test_the_command_line_check_refuses_them_before_warming_a_side():
    trainer = SmallVocabTrainer(MODULE)
    with pytest.raises(ProbeVocabularyError, match="trainer's vocabulary of 100"):
        _warm(trainer, make_probes(512), generate=False, name="trainer")
    assert trainer.scored == []


@pytest.mark.parametrize("vocab", [0, 8, -3, True, 2.5])
def test_a_vocabulary_with_no_probe_ids_is_refused(vocab):
    with pytest.raises(ProbeVocabularyError, match="the probes need token ids 8.."):
        make_probes(vocab)


def test_the_fixture_takes_the_vocabulary_from_the_trainer():
    trainer, sampler, publisher = _sides()
    report = HandoffChecker().assert_passes(trainer, sampler, publisher, decode=False)
    assert report.passed and trainer.scored and max(max(s) for s in trainer.scored) < 100


def test_the_fixture_without_a_vocabulary_says_what_to_give():
    sampler = ToySampler(MODULE)
    with pytest.raises(ProbeVocabularyError, match="pass vocab_size=N"):
        HandoffChecker().run(ToyTrainer(MODULE), sampler, InMemoryPublisher(sampler, SharedMemoryTransport()))
    report = HandoffChecker().run(
        ToyTrainer(MODULE), sampler, InMemoryPublisher(sampler, SharedMemoryTransport()), vocab_size=512, decode=False
    )
    assert report.passed


def _report_with_long_numbers():
    from skyrl_glm.check.algorithm import CheckReport, Diff, StepResult

    tiny = Diff([1.234567e-7, 2.345678e-8, 0.0], [1e-9, 2e-9, 0.0])
    steps = [StepResult(1, "agree-before", True, "", 12.345, tiny, tiny), StepResult(3, "detect-stale", True, "", 1.0)]
    return CheckReport(CheckConfig(), steps)


def test_the_check_table_in_a_pipe_keeps_every_number_whole(capsys):
    """Not a terminal (a pipe, a log): rich's 80 columns cut the table's numbers with an ellipsis."""
    from skyrl_glm.check.report import print_table

    print_table(_report_with_long_numbers())
    out = capsys.readouterr().out
    assert "…" not in out
    for number in ("4.897e-08", "1.235e-07 / 2e-09", "12.35"):  # mean, max / |dp|, seconds
        assert number in out, out


@pytest.mark.parametrize("width", [40, 60, 80])
def test_a_narrow_terminal_folds_cells_and_never_cuts_them(width):
    from rich.console import Console

    from skyrl_glm.check.report import print_table

    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    print_table(_report_with_long_numbers(), console)
    assert "…" not in console.export_text()
