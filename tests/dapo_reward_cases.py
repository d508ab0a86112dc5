"""Answer cases from public verifier test suites, written out as GLM responses, with the suites' expected verdicts.

Sources (the gold/prediction pairs and their expected verdicts are the suites' facts; the GLM wrapping is ours):
- math-verify (huggingface/Math-Verify, ``tests/test_all.py``): number extraction (signs, thousands and decimal
  separators, currency), simple fractions, intervals, LaTeX notation (delimiters, malformed ``\\frac13`` /
  ``\\sqrt3``, ``\\dfrac``/``\\tfrac``/``\\cfrac``, ``\\left(``, units in ``\\text{}``, ``k = ...``), percentages.
- verl (volcengine/verl, ``tests/utils/reward_score/test_numeric_canonicalization_on_cpu.py``): leading zeros and
  signs on integers (``033``, ``+033``, ``-0``, ``000``).
- the defects a review found in the earlier GLM extraction (``Answer: \\(42\\).``, ``$$42$$.``, display math after
  ``**Final Answer:**``, an ``Answer:`` line followed by a corrected ``\\boxed{}``, DAPO's ``%`` / ``°`` /
  ``\\dfrac`` / ``33.0`` string rules).

Run as a script to print the accuracy table (rich) and write it as JSON:
``python tests/dapo_reward_cases.py --json reward_suite.json``.
"""

from __future__ import annotations

from dataclasses import dataclass

MV = "math-verify"
VERL = "verl"
REVIEW = "review"


@dataclass(frozen=True)
class Case:
    source: str
    gold: str
    response: str
    expected: bool


# GLM's ways of writing a final answer; the cases rotate through them.
WRAPPERS = (
    "<think>Let me work it out carefully.</think>Working through the steps gives the result.\n\nAnswer: {}<|user|>",
    "<think>Check the arithmetic twice.</think>So the final result is $\\boxed{{{}}}$.<|endoftext|>",
    "<think>Done thinking.</think>**Final Answer**\n\n\\[\n\\boxed{{{}}}\n\\]<|user|>",
    "<think>ok</think>Summing up the cases.\n\n**Answer:** {}<|observation|>",
)


def _wrapped(source: str, pairs: list[tuple[str, str, bool]]) -> list[Case]:
    return [Case(source, g, WRAPPERS[i % len(WRAPPERS)].format(p), e) for i, (g, p, e) in enumerate(pairs)]


# (gold, what the model answers, expected verdict)
_MATH_VERIFY = [
    # numbers
    ("-5", "-5", True),
    ("7425000", "7,425,000", True),
    ("1000", "1 000", True),
    ("1000", "1000.0", True),
    ("1000.0", "1,000.0", True),
    ("1000.99", "1000,99", True),
    ("1,22", "1.22", True),
    ("0.4", ".4", True),
    ("1000.99", "1,000.99", True),
    ("1000.99", "\\$1,000.99", True),
    ("0,111", "0.111", True),
    ("2", "AZYUK2A", False),
    # fractions
    ("10/9", "\\frac{10}{9}", True),
    ("-10/9", "-\\frac{10}{9}", True),
    # intervals
    ("[0,1)", "[0,1)", True),
    ("[0,9)", "[0,1)", False),
    ("(0,9)", "[0,9)", False),
    ("1", "-[0,1)", False),
    # LaTeX notation
    ("9", "\\( (9) \\)", True),
    ("10", "\\( (9+1) \\)", True),
    ("1/3", "\\frac13", True),
    ("1", "\\frac3{3}", True),
    ("\\sqrt{3}", "\\sqrt3", True),
    ("1/3", "\\cfrac{1}{3}", True),
    ("1/3", "\\dfrac{1}{3}", True),
    ("1/3", "\\tfrac{1}{3}", True),
    ("1/3", "1/3", True),
    ("1/3", "\\left( \\frac{1}{3} \\right)", True),
    ("1/3", "\\frac{1}{3} \\text{meters}", True),
    ("1/3", "\\frac{1}{3} \\textbf{meters}", True),
    ("1/3", "k = \\frac{1}{3}", True),
    # percentages
    ("28\\%", "28 percent", True),
    ("28\\%", "28 %", True),
    ("28\\%", "28", True),
    ("0.28", "28", False),
    ("28/100", "28", False),
    ("28", "28/100", False),
    ("\\frac{28}{100}", "28", False),
    # answers from its model-output regression cases
    ("2-2p", "2-2p", True),
    ("\\frac{14}{3}", "\\frac{14}{3}", True),
    ("\\text{Evelyn}", "\\text{Evelyn}", True),
    ("(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("90^\\circ", "90^\\circ", True),
    ("14{,}916", "14{,}916", True),
]

# The same notation cases with the delimiters the suite varies (its test_latex_notation), one per GLM form.
_DELIMITED = [
    Case(MV, "9", "<think>x</think>Answer: \\[ 9 \\]<|user|>", True),
    Case(MV, "9", "<think>x</think>Answer: $ 9 $<|user|>", True),
    Case(MV, "9", "<think>x</think>Answer: $$ 9 $$<|user|>", True),
    Case(MV, "9", "<think>x</think>Answer: \\( 9 \\)<|user|>", True),
    Case(MV, "9", "<think>x</think>**Final Answer:**\n\n\\[\n9\n\\]<|user|>", True),
    Case(MV, "9", "<think>x</think>**Final Answer:**\n\n$$\n9\n$$<|user|>", True),
    Case(MV, "1/3", "<think>x</think>Answer: $\\boxed{\\frac{1}{3}}$<|user|>", True),
]

_VERL = [
    ("033", "33", True),
    ("+033", "33", True),
    ("-0", "0", True),
    ("000", "0", True),
]

# GLM forms the review found scored wrong, and wrong answers that must stay wrong.
_REVIEW = [
    Case(REVIEW, "42", "<think>t</think>Answer: \\(42\\).<|user|>", True),
    Case(REVIEW, "42", "<think>t</think>Answer: $$42$$.<|user|>", True),
    Case(REVIEW, "42", "<think>t</think>**Final Answer:**\n\n\\[\n42\n\\]\n<|user|>", True),
    Case(REVIEW, "42", "<think>t</think>Answer: 41\n\nWait, 6 x 7 is 42, so the answer is \\boxed{42}.<|user|>", True),
    Case(REVIEW, "42", "<think>t</think>First guess \\boxed{41}; correcting it.\n\nAnswer: 42<|user|>", True),
    Case(REVIEW, "33", "<think>t</think>Answer: 033<|user|>", True),
    Case(REVIEW, "33", "<think>t</think>Answer: 33.0<|user|>", True),
    Case(REVIEW, "\\frac{1}{2}", "<think>t</think>Answer: 0.5<|user|>", True),
    Case(REVIEW, "\\frac{3}{4}", "<think>t</think>Answer: \\dfrac{3}{4}<|user|>", True),
    Case(REVIEW, "50", "<think>t</think>Answer: 50\\%<|user|>", True),
    Case(REVIEW, "90", "<think>t</think>Answer: $90^\\circ$<|user|>", True),
    Case(REVIEW, "90", "<think>t</think>Answer: 90°<|user|>", True),
    Case(REVIEW, "42", "<think>t</think>Answer: 42<|user|>\nAnswer: 7", True),
    Case(REVIEW, "42", "<think>t</think>Answer: 41<|user|>", False),
    Case(REVIEW, "42", "<think>Answer: 42</think>The answer is \\boxed{41}.<|user|>", False),
    Case(REVIEW, "42", "<think>Try 42. Answer: 42 maybe \\boxed{4", False),
    Case(REVIEW, "42", "<think>ok</think>The answer is \\boxed{4", False),
    Case(REVIEW, "42", "<think>ok</think>I could not solve it.<|user|>", False),
    Case(REVIEW, "42", "<think>ok</think>Answer: 42 or 43<|user|>", False),
    Case(REVIEW, "42", "<think>ok</think>Answer: 420<|user|>", False),
    Case(REVIEW, "1", "<think>ok</think>Answer: 1,000<|user|>", False),
    Case(REVIEW, "\\frac{1}{3}", "<think>ok</think>Answer: 0.333<|user|>", False),
    Case(REVIEW, "\\sqrt{3}", "<think>ok</think>Answer: \\sqrt{2}<|user|>", False),
    Case(REVIEW, "2", "<think>ok</think>Answer: 2x<|user|>", False),
    # hedges: an answer taken back or offered beside another pays nothing, whichever of them is true
    Case(REVIEW, "41", "<think>ok</think>Answer: $41$ or maybe $42$<|user|>", False),
    Case(REVIEW, "41", "<think>ok</think>Answer: $41$, no wait, 42<|user|>", False),
    Case(REVIEW, "42", "<think>ok</think>Answer: \\boxed{41} or \\boxed{42}<|user|>", False),
    Case(REVIEW, "42", "<think>ok</think>Answer: 41, or rather \\boxed{42}<|user|>", False),
    Case(REVIEW, "41", "<think>ok</think>\\boxed{41}\n\nAnswer: $42$ or perhaps $41$<|user|>", False),
    Case(REVIEW, "28", "<think>ok</think>The final answer is $28$. I hope it is correct.<|user|>", True),
]

CASES: list[Case] = [
    *_wrapped(MV, _MATH_VERIFY),
    *_DELIMITED,
    *_wrapped(VERL, _VERL),
    *_REVIEW,
]


def run(cases: list[Case] = CASES) -> list[dict]:
    """Every case scored in both reward modes and by skyrl_gym's ``aime`` reward on the raw response."""
    from skyrl_gym.envs.aime.utils import compute_score as aime_score

    from skyrl_glm.dapo.reward import score

    rows = []
    for case in cases:
        ours = score(case.response, case.gold)
        strict = score(case.response, case.gold, mode="dapo_strict")
        rows.append(
            {
                "source": case.source,
                "gold": case.gold,
                "expected": case.expected,
                "math_verify": ours.correct,
                "math_verify_path": ours.path,
                "dapo_strict": strict.correct,
                "aime": aime_score(case.response, case.gold)["score"] > 0,
            }
        )
    return rows


def accuracy_table(rows: list[dict]) -> list[dict]:
    """Per source and overall: cases, right verdicts and false +1 of each scorer."""
    table = []
    for source in [*dict.fromkeys(r["source"] for r in rows), "all"]:
        group = [r for r in rows if source in ("all", r["source"])]
        entry = {"source": source, "cases": len(group)}
        for scorer in ("math_verify", "dapo_strict"):
            entry[f"{scorer}_right"] = sum(r[scorer] == r["expected"] for r in group)
            entry[f"{scorer}_false_pos"] = sum(r[scorer] and not r["expected"] for r in group)
        table.append(entry)
    return table


def main() -> None:
    import argparse
    import json

    from rich.console import Console
    from rich.table import Table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the per-case verdicts and the table here")
    args = parser.parse_args()
    rows = run()
    summary = accuracy_table(rows)
    table = Table(title="reward on public verifier cases written as GLM responses")
    for col in ("source", "cases", "math_verify right", "false +1", "dapo_strict right", "false +1 "):
        table.add_column(col, justify="left" if col == "source" else "right")
    for e in summary:
        table.add_row(
            e["source"],
            str(e["cases"]),
            f"{e['math_verify_right']} ({e['math_verify_right'] / e['cases']:.0%})",
            str(e["math_verify_false_pos"]),
            f"{e['dapo_strict_right']} ({e['dapo_strict_right'] / e['cases']:.0%})",
            str(e["dapo_strict_false_pos"]),
        )
    Console().print(table)
    for r in rows:
        if r["math_verify"] != r["expected"]:
            print(f"math_verify wrong: {r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"table": summary, "cases": rows}, f, indent=2)


if __name__ == "__main__":
    main()
