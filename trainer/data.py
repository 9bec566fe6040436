"""Tasks: procedural arithmetic (seeded, difficulty knob), GSM8K-format JSONL, reasoning-gym."""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path

from .config import TrainConfig
from .rewards import extract_answer

log = logging.getLogger("vantage.trainer")

__all__ = ["Problem", "Task", "ArithmeticTask", "ListTask", "load_task", "read_gsm8k_jsonl"]


@dataclass(frozen=True)
class Problem:
    """One prompt: ``prompt_id`` (stable across steps, ≤ 128 chars), question and gold answer."""

    prompt_id: str
    question: str
    answer: str


class Task:
    """Draws training problems and holds the held-out evaluation set."""

    eval_problems: list[Problem]

    def sample(self, n: int, rng: random.Random) -> list[Problem]:  # pragma: no cover - abstract
        raise NotImplementedError


class ArithmeticTask(Task):
    """``a+b=`` style problems; ``max_operand`` is the difficulty knob.

    ``template`` may use ``{question}`` ("12+7=") or ``{expression}`` ("12+7"). The held-out
    set comes from its own seed and is excluded from training when the problem space is at least
    twice its size.
    """

    def __init__(
        self,
        max_operand: int = 20,
        terms: int = 2,
        operators: str = "+",
        seed: int = 0,
        eval_size: int = 128,
        template: str = "{question}",
    ) -> None:
        if max_operand < 1 or terms < 2 or not operators or set(operators) - set("+-*"):
            raise ValueError("arithmetic needs max_operand ≥ 1, terms ≥ 2 and operators from '+-*'")
        self.max_operand, self.terms, self.operators = max_operand, terms, operators
        self.template = template
        space = (max_operand + 1) ** terms * len(operators) ** (terms - 1)
        eval_rng = random.Random(f"arith-eval-{seed}")
        unique: dict[str, Problem] = {}
        while len(unique) < min(eval_size, space):
            p = self._draw(eval_rng)
            unique[p.question] = p
        self.eval_problems = list(unique.values())
        self._excluded = set(unique) if space >= 2 * len(unique) else set()
        if not self._excluded:  # said: the accuracy is then measured on training data
            log.warning(
                "the evaluation set is not held out: %d distinct problems (arith_max_operand %d, "
                "arith_terms %d, arith_operators %r) are fewer than twice eval_size (%d), so "
                "training draws from the %d evaluation problems too",
                space, max_operand, terms, operators, eval_size, len(unique),
            )  # fmt: skip

    def _draw(self, rng: random.Random) -> Problem:
        parts = [str(rng.randint(0, self.max_operand))]
        for _ in range(self.terms - 1):
            parts += [rng.choice(self.operators), str(rng.randint(0, self.max_operand))]
        expression = "".join(parts)
        value = eval(expression, {"__builtins__": {}})  # noqa: S307 - digits and +-* only
        question = self.template.format(question=f"{expression}=", expression=expression)
        return Problem(prompt_id=expression, question=question, answer=str(value))

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        out: list[Problem] = []
        while len(out) < n:
            p = self._draw(rng)
            if p.question not in self._excluded:
                out.append(p)
        return out

    def sft_text(self, problem: Problem) -> tuple[str, str]:
        """(prompt, target) for supervised warm start."""
        return problem.question, problem.answer


class ListTask(Task):
    """A fixed list of problems (JSONL, reasoning-gym), sampled with replacement."""

    def __init__(self, train: list[Problem], eval_problems: list[Problem]) -> None:
        if not train:
            raise ValueError("the task has no training problems")
        self.train, self.eval_problems = train, eval_problems

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        return [rng.choice(self.train) for _ in range(n)]


def read_gsm8k_jsonl(path: str | Path, template: str = "{question}") -> list[Problem]:
    """Rows ``{"question", "answer"}`` whose answer ends ``#### N``; raises ValueError naming the
    line of a malformed row."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"data file {path} does not exist (GSM8K-format JSONL expected)")
    problems = []
    for i, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            gold = extract_answer(str(row["answer"])) if "####" in str(row["answer"]) else None
            question = str(row["question"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}:{i}: expected a JSON object with question and answer"
            ) from exc
        if gold is None:
            raise ValueError(f"{path}:{i}: the answer must end with '#### N' (GSM8K format)")
        problems.append(Problem(f"{Path(path).stem}-{i}", template.format(question=question), gold))
    return problems


def _reasoning_gym(config: TrainConfig) -> ListTask:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(
            "task reasoning_gym needs reasoning-gym: pip install 'vantage-rl[reasoning]'"
        ) from exc
    size = 2000
    data = reasoning_gym.create_dataset(config.reasoning_gym_task, size=size, seed=config.seed)
    problems = [
        Problem(
            f"{config.reasoning_gym_task}-{i}",
            config.prompt_template.format(question=row["question"]),
            str(row["answer"]),
        )
        for i, row in enumerate(data)
    ]
    n_eval = _held_out(config.eval_size, len(problems))
    return ListTask(problems[n_eval:], problems[:n_eval])


def _held_out(eval_size: int, n_rows: int) -> int:
    """How many of ``n_rows`` problems to hold out for evaluation: ``eval_size``, at most half
    of them, so that something is left to train on (said when it is fewer)."""
    n_eval = min(eval_size, n_rows // 2)
    if n_eval < eval_size:
        log.warning(
            "eval_size %d: %d of the %d problems are held out for evaluation (at most half)",
            eval_size, n_eval, n_rows,
        )  # fmt: skip
    return n_eval


def load_task(config: TrainConfig) -> Task:
    """The task ``config.task`` names."""
    if config.task == "arithmetic":
        return ArithmeticTask(
            config.arith_max_operand,
            config.arith_terms,
            config.arith_operators,
            config.seed,
            config.eval_size,
            config.prompt_template,
        )
    if config.task == "jsonl":
        rows = read_gsm8k_jsonl(config.data_path, config.prompt_template)  # type: ignore[arg-type]
        if config.eval_data_path:
            return ListTask(rows, read_gsm8k_jsonl(config.eval_data_path, config.prompt_template))
        n_eval = _held_out(config.eval_size, len(rows))
        return ListTask(rows[: len(rows) - n_eval], rows[len(rows) - n_eval :])
    return _reasoning_gym(config)
