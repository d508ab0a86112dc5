"""The glm_math reward: GLM extraction, exact numbers, math-verify under a time cap, DAPO's string reward as
``dapo_strict``; scored on public verifier cases (tests/dapo_reward_cases.py names the suites)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import skyrl_gym
from dapo_reward_cases import CASES, accuracy_table, run
from skyrl_gym.envs.aime.utils import compute_score as aime_score

from skyrl_glm.dapo import reward
from skyrl_glm.dapo.answer import extract_answer, final_text
from skyrl_glm.dapo.env import ENV_ID, GlmMathEnv, register
from skyrl_glm.dapo.reward import score
from skyrl_glm.dapo.verify import Verdict, as_number, equivalent

# Right answers math-verify itself accepts only through its plain-expression extraction (a space or a decimal
# comma as separator): our verifier parses an answer as LaTeX first and scores these -1 (a false -1, never a
# false +1). Asserted as misses, so a change in either direction shows.
KNOWN_MISSES = {("1000", "1 000"), ("1000.99", "1000,99"), ("1,22", "1.22")}


@pytest.fixture(scope="module")
def suite_rows():
    return run()


def test_public_suite_size_and_no_false_positive(suite_rows):
    assert len(CASES) >= 60
    assert {r["source"] for r in suite_rows} == {"math-verify", "verl", "review"}
    false_pos = [r for r in suite_rows if r["math_verify"] and not r["expected"]]
    assert false_pos == []
    overall = accuracy_table(suite_rows)[-1]
    assert overall["source"] == "all" and overall["cases"] == len(CASES)
    # DAPO's string reward on the same GLM responses is far below, and the reward here misses only KNOWN_MISSES.
    assert overall["math_verify_right"] == len(CASES) - len(KNOWN_MISSES)
    assert overall["dapo_strict_right"] < len(CASES) / 2


@pytest.mark.parametrize("case", CASES, ids=[f"{c.source}:{c.gold}:{i}" for i, c in enumerate(CASES)])
def test_each_public_case(case):
    scored = score(case.response, case.gold)
    missed = any(case.gold == g and extract_answer(case.response) == p for g, p in KNOWN_MISSES)
    assert scored.correct == (case.expected and not missed), (case, scored)
    assert scored.reward == (1.0 if scored.correct else -1.0)


def test_dapo_strict_is_skyrl_gym_aime_env(suite_rows):
    # The comparison mode gives what skyrl_gym's own `aime` env gives, case by case, through the env registry.
    for case, row in zip(CASES, suite_rows, strict=True):
        env = skyrl_gym.make("aime", env_config={}, extras={"reward_model": {"ground_truth": case.gold}})
        assert (env.step(case.response)["reward"] > 0) == row["dapo_strict"] == row["aime"], case
    # and it keeps DAPO's last-300-characters window: an answer further from the end is not seen
    far = "Answer: 42\n" + "x" * 300
    assert aime_score(far, "42")["score"] == -1.0 and not score(far, "42", mode="dapo_strict").correct
    assert score(far, "42").correct  # the GLM extraction searches the final text's tail (WINDOW_CHARS)


def test_suite_catches_a_lenient_verifier(monkeypatch):
    # A deliberately broken equivalence (numbers compared to 2 significant digits) must show up as false +1.
    def lenient(answer, truth, time_cap_s=0):
        a, t = as_number(answer), as_number(truth)
        ok = a is not None and t is not None and f"{float(a):.2g}" == f"{float(t):.2g}"
        return Verdict(ok, "broken")

    monkeypatch.setattr(reward, "equivalent", lenient)
    rows = run([c for c in CASES if c.source == "review"])
    assert accuracy_table(rows)[-1]["math_verify_false_pos"] > 0


@pytest.mark.parametrize(
    "text,value",
    [("033", 33), ("+033", 33), ("33.0", 33), ("\\dfrac{1}{2}", 0.5), ("\\frac12", 0.5), ("50\\%", 50),
     ("90^{\\circ}", 90), ("14{,}916", 14916), ("x = -7", -7), ("1,000", 1000), ("2/4", 0.5)],
)
def test_numbers_exact(text, value):
    assert as_number(text) == value


@pytest.mark.parametrize("text", ["2x", "1,22", "0,111", "4 or 5", "\\sqrt{4}", "1.2.3", "", "nan", "1e3"])
def test_not_plain_numbers(text):
    assert as_number(text) is None


def test_exact_rationals_never_round():
    assert not equivalent("0.333333333333", "\\frac{1}{3}").equal
    assert not equivalent("1000000000000000001", "1000000000000000000").equal
    assert equivalent("0.5", "\\frac{1}{2}").path == "number"


ADVERSARIAL = {
    "Answer: then newlines": "Answer:" + "\n" * 1_000_000,  # the old regex took 32 s on 32 k of these
    "box openers": "\\boxed{" * 150_000,
    "open braces": "{" * 1_000_000,
    "answer words": "answer " * 150_000,
    "Answer: repeated": "Answer: " * 125_000,
    "one long number": "Answer: " + "1" * 1_000_000,
    "unclosed think": "<think>" + "a" * 1_000_000,
    "end-of-turn prefixes": "<|user" * 170_000,
    "display openers": "**Final Answer:**\n" + "\\[\n" * 340_000,
    "dollars": "Answer: " + "$" * 1_000_000,
    "spaces before the colon": "Answer" + " " * 1_000_000 + ":",
    "bold before the colon": "Answer" + "*" * 1_000_000 + ":",
}


@pytest.mark.parametrize("text", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_a_megabyte_of_adversarial_text_scores_in_under_50_ms(text):
    assert len(text) >= 1_000_000
    score(text, "42")  # warm (first-call regex compilation)
    started = time.perf_counter()
    scored = score(text, "42")
    elapsed = time.perf_counter() - started
    assert elapsed < 0.05, f"{elapsed * 1e3:.1f} ms"
    assert scored.reward == -1.0


def test_time_cap_on_the_math_verify_path():
    # sympy on a power tower runs for a very long time; the helper is killed at the cap and replaced.
    tower = "<think>t</think>Answer: 10^{10^{10^{10}}}<|user|>"
    score("<think>t</think>Answer: \\sqrt{2}<|user|>", "\\sqrt{2}")  # the helper is up
    started = time.monotonic()
    capped = score(tower, "3", time_cap_s=0.5)
    assert capped.path == "timeout" and capped.reward == -1.0
    assert time.monotonic() - started < 2.0
    after = score("<think>t</think>Answer: \\sqrt{2}+1<|user|>", "1+\\sqrt{2}")
    assert after.correct and after.path == "math-verify"


def test_a_dead_helper_is_replaced():
    from skyrl_glm.dapo import verify

    assert score("Answer: \\sqrt{9}", "3").correct  # helper up
    verify._HELPER._proc.kill()
    verify._HELPER._proc.wait()
    assert score("Answer: \\sqrt{16}", "4").correct


def test_scores_from_a_thread_pool_like_skyrl():
    # SkyRL runs env.step in a ThreadPoolExecutor: math-verify's own signal timeout refuses threads; ours does not.
    jobs = [("Answer: \\sqrt{8}", "2\\sqrt{2}", True), ("Answer: \\pi", "\\frac{\\pi}{2}", False),
            ("Answer: 033", "33", True), ("Answer: 7", "8", False)] * 3
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda j: score(j[0], j[1]).correct, jobs))
    assert results == [j[2] for j in jobs]


def test_extraction_forms():
    assert extract_answer("Answer: \\(42\\).") == "42"
    assert extract_answer("Answer: $$42$$.") == "42"
    assert extract_answer("**Final Answer:**\n\n\\[\n\\frac{1}{2}\n\\]\n") == "\\frac{1}{2}"
    assert extract_answer("Answer: 41\n\nso \\boxed{42}") == "42"
    assert extract_answer("\\boxed{41}\nAnswer: 42") == "42"
    assert extract_answer("The final answer is $28\\%$. I hope it is correct.") == "28\\%"
    assert extract_answer("**Answer: \\boxed{7}**") == "7"
    assert extract_answer("Answer: " + "x" * 5000) is None  # prose, not an answer
    # a final box cut off by the length cap is no answer, and does not fall back to an earlier one
    assert extract_answer("Answer: 41\nWait, recheck: \\boxed{4") is None
    assert extract_answer("\\boxed{42} or rather \\boxed{4") is None
    assert final_text("<think>Answer: 4</think>ok<|user|>more") == "ok"
    assert final_text("<think>still thinking, Answer: 4") is None


def test_glm_math_env_registered_in_skyrl_gym():
    register()
    register()  # idempotent
    env = skyrl_gym.make(ENV_ID, env_config={}, extras={"reward_model": {"ground_truth": "42"}})
    assert isinstance(env, GlmMathEnv)
    out = env.step("Answer: \\(42\\).<|user|>")
    assert out["reward"] == 1.0 and out["done"] and out["metadata"]["pred"] == "42"
    assert env.get_metrics() == {"acc": 1.0}
    wrong = skyrl_gym.make(ENV_ID, env_config={}, extras={"reward_model": {"ground_truth": "41"}})
    assert wrong.step("Answer: \\(42\\)")["reward"] == -1.0
    assert wrong.get_metrics() == {"acc": 0.0}


def test_glm_math_env_needs_ground_truth():
    with pytest.raises(ValueError, match="ground_truth"):
        GlmMathEnv(extras={"reward_model": {}})


def test_unknown_mode_refused():
    with pytest.raises(ValueError, match="unknown reward mode 'strict'"):
        score("Answer: 1", "1", mode="strict")  # type: ignore[arg-type]
