"""GLM answer extraction in front of skyrl_gym's DAPO math reward, and the registered ``glm_math`` env."""

from __future__ import annotations

import pytest
import skyrl_gym
from skyrl_gym.envs.aime.utils import compute_score as aime_score

from skyrl_glm.dapo.answer import extract_answer, final_text, score
from skyrl_glm.dapo.env import ENV_ID, GlmMathEnv, register

# GLM-style outputs the plain aime reward (skyrl_gym's DAPO reward on the raw text) scores -1 though they are right.
RIGHT_BUT_AIME_REJECTS = [
    ("inline \\( \\) math + end-of-turn token", "Let me compute.\nAnswer: \\(42\\)<|user|>", "42"),
    ("display \\[ \\] on the next line", "So the total is 42.\nAnswer:\n\n\\[ 42 \\]<|endoftext|>", "42"),
    ("bold markdown answer line", "Adding up gives 42.\n\n**Answer:** 42", "42"),
    ("bare \\boxed{} after </think>", "<think>maybe Answer: 41? no.</think>The result is \\boxed{42}.<|user|>", "42"),
    ("final period", "Answer: 42.<|endoftext|>", "42"),
    ("fraction in inline math", "Answer: \\(\\frac{3}{4}\\)<|observation|>", "\\frac{3}{4}"),
    ("next turn hallucinated after the end-of-turn token", "Answer: 42<|user|>\nAnswer: 7", "42"),
]


@pytest.mark.parametrize("case,response,truth", RIGHT_BUT_AIME_REJECTS, ids=[c[0] for c in RIGHT_BUT_AIME_REJECTS])
def test_glm_outputs_aime_rejects_and_glm_math_accepts(case, response, truth):
    assert aime_score(response, truth)["score"] == -1.0
    scored = score(response, truth)
    assert scored.correct and scored.reward == 1.0, (case, scored)


@pytest.mark.parametrize(
    "response,truth",
    [
        ("Answer: \\(41\\)<|user|>", "42"),
        ("**Answer:** 43", "42"),
        ("<think>Answer: 42</think>The answer is \\boxed{41}.", "42"),
        ("Answer: $\\frac{4}{3}$", "\\frac{3}{4}"),
        ("I could not solve it.<|user|>", "42"),
        ("", "42"),
    ],
)
def test_wrong_or_missing_answers_still_rejected(response, truth):
    scored = score(response, truth)
    assert not scored.correct and scored.reward == -1.0


def test_plain_dapo_format_scores_like_aime():
    # What the DAPO reward already accepts stays accepted, with the same +1.
    for response in ("Step 1 ...\nAnswer: 42", "Answer: $42$", "Answer: \\boxed{42}"):
        assert aime_score(response, "42")["score"] == 1.0
        assert score(response, "42").reward == 1.0


def test_truncated_at_the_cap_mid_thought_has_no_answer():
    # Cut by the length cap inside <think>: no end-of-turn, no </think>. An "Answer:" inside the thought is not a
    # committed answer, and an unclosed \boxed{ must not crash the verifier.
    truncated = "<think>Try 42. Answer: 42 maybe, check: \\boxed{4"
    assert final_text(truncated) is None
    assert extract_answer(truncated) is None
    assert score(truncated, "42").reward == -1.0
    # Truncated after the thought, mid-answer: the unclosed box is no answer either.
    assert score("<think>ok</think>The answer is \\boxed{4", "42").reward == -1.0


def test_glm_math_env_registered_in_skyrl_gym():
    register()
    register()  # idempotent
    env = skyrl_gym.make(ENV_ID, env_config={}, extras={"reward_model": {"ground_truth": "42"}})
    assert isinstance(env, GlmMathEnv)
    out = env.step("Answer: \\(42\\)<|user|>")
    assert out["reward"] == 1.0 and out["done"] and out["metadata"]["pred"] == "42"
    assert env.get_metrics() == {"acc": 1.0}
    wrong = skyrl_gym.make(ENV_ID, env_config={}, extras={"reward_model": {"ground_truth": "41"}})
    assert wrong.step("Answer: \\(42\\)")["reward"] == -1.0
    assert wrong.get_metrics() == {"acc": 0.0}


def test_glm_math_env_needs_ground_truth():
    with pytest.raises(ValueError, match="ground_truth"):
        GlmMathEnv(extras={"reward_model": {}})
