"""Answer extraction, exact numeric match, and the tasks."""

import json
import random

import pytest
from vantage.trainer.config import TrainConfig
from vantage.trainer.data import ArithmeticTask, load_task, read_gsm8k_jsonl
from vantage.trainer.rewards import answers_match, extract_answer, math_reward, parse_number


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so it is 18.\n#### 18", "18"),
        ("#### 1,234", "1,234"),
        ("the answer is \\boxed{\\frac{7}{2}} ok", "\\frac{7}{2}"),
        ("\\boxed{x^{2}}", "x^{2}"),
        ("3 apples and 4 pears make 7", "7"),
        ("-5", "-5"),
        ("no number here", None),
        ("12+7=19", "19"),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


def test_exact_numeric_match():
    assert answers_match("1,234", "1234")
    assert answers_match("1.50", "1.5")
    assert answers_match("\\frac{7}{2}", "3.5")
    assert answers_match("$12", "12")
    assert not answers_match("12.01", "12")
    assert not answers_match(None, "12")
    assert parse_number("abc") is None
    assert math_reward("19", "19") == 1.0
    assert math_reward("18", "19", reward_min=-1.0) == -1.0


def test_arithmetic_is_seeded_with_a_difficulty_knob():
    task = ArithmeticTask(max_operand=5, seed=3, eval_size=8)
    a = task.sample(50, random.Random(1))
    b = ArithmeticTask(max_operand=5, seed=3, eval_size=8).sample(50, random.Random(1))
    assert a == b
    for p in a:
        x, y = p.question.rstrip("=").split("+")
        assert 0 <= int(x) <= 5 and 0 <= int(y) <= 5 and int(p.answer) == int(x) + int(y)
        assert p.prompt_id == p.question.rstrip("=")
    # held out: never drawn for training when the space is large enough (36 >= 2 * 8)
    held_out = {p.question for p in task.eval_problems}
    assert len(held_out) == 8 and not held_out & {p.question for p in a}
    hard = ArithmeticTask(max_operand=999, terms=3, operators="+-*", seed=0)
    assert any(int(p.answer) > 1000 for p in hard.sample(50, random.Random(0)))


def test_an_evaluation_set_that_cannot_be_held_out_is_said(tmp_path, caplog):
    """eval_size 500 of the 441 a+b problems up to 20 evaluated on the training set, silently
    (a trial)."""
    caplog.set_level("WARNING", logger="vantage.trainer")
    ArithmeticTask(max_operand=20, seed=0, eval_size=100)  # 441 >= 2 * 100: held out
    assert "not held out" not in caplog.text
    ArithmeticTask(max_operand=20, seed=0, eval_size=500)
    assert "the evaluation set is not held out: 441 distinct problems" in caplog.text
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": f"{i}+1?", "answer": f"#### {i + 1}"} for i in range(10)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = load_task(TrainConfig(task="jsonl", data_path=str(path), eval_size=8))
    assert len(task.eval_problems) == 5 and len(task.train) == 5
    assert "eval_size 8: 5 of the 10 problems are held out" in caplog.text


def test_gsm8k_jsonl(tmp_path):
    path = tmp_path / "gsm.jsonl"
    rows = [
        {"question": f"What is {i}+1?", "answer": f"It is {i + 1}.\n#### {i + 1}"}
        for i in range(10)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    problems = read_gsm8k_jsonl(path, "Q: {question}")
    assert problems[0].question == "Q: What is 0+1?" and problems[0].answer == "1"
    task = load_task(TrainConfig(task="jsonl", data_path=str(path), eval_size=3))
    assert len(task.eval_problems) == 3 and len(task.train) == 7
    path.write_text(json.dumps({"question": "q", "answer": "no hashes"}) + "\n")
    with pytest.raises(ValueError, match=r"gsm.jsonl:1: the answer must end with '#### N'"):
        read_gsm8k_jsonl(path)


def test_reasoning_gym_is_optional():
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is an optional extra")
    task = load_task(TrainConfig(task="reasoning_gym", eval_size=4))
    assert len(task.eval_problems) == 4


def test_math_verify_is_optional():
    pytest.importorskip("math_verify", reason="math-verify is an optional extra")
    assert answers_match("\\frac{7}{2}", "3.5", use_math_verify=True)
    assert not answers_match("4", "3.5", use_math_verify=True)
    assert math_reward("so \\boxed{0.5}", "\\frac{1}{2}", use_math_verify=True) == 1.0
