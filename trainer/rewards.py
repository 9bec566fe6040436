"""Verifiable math rewards: extract a final answer from a completion and match it exactly."""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["extract_answer", "parse_number", "answers_match", "math_reward"]

_HASHES = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def _boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}``, braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j].strip()
    return None


def extract_answer(text: str) -> str | None:
    """The final answer of a completion: after ``#### ``, else the last ``\\boxed{}``, else the last
    number in the text; None when there is none."""
    found = _HASHES.findall(text)
    if found:
        return found[-1].strip()
    boxed = _boxed(text)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def parse_number(text: str | None) -> Fraction | None:
    """An exact number from '1,234', '-3.50', '7/2', '$12' or '\\frac{7}{2}'; None if it is none."""
    if text is None:
        return None
    cleaned = text.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    frac = re.fullmatch(r"\\d?frac\{(-?\d+)\}\{(\d+)\}", cleaned)
    if frac:
        cleaned = f"{frac.group(1)}/{frac.group(2)}"
    match = _NUMBER.fullmatch(cleaned) or _NUMBER.search(cleaned)
    if not match:
        return None
    try:
        return Fraction(match.group(0))
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(predicted: str | None, gold: str, use_math_verify: bool = False) -> bool:
    """Exact numeric equality (1.50 == 1.5 == 3/2); math-verify's symbolic check when asked."""
    if predicted is None:
        return False
    if use_math_verify:
        try:
            from math_verify import parse, verify
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise ImportError(
                "math_verify: true needs math-verify: pip install 'vantage-rl[reasoning]'"
            ) from exc
        return bool(verify(parse(gold), parse(predicted)))
    a, b = parse_number(predicted), parse_number(gold)
    if a is None or b is None:
        return predicted.strip() == gold.strip()
    return a == b


def math_reward(
    completion: str,
    gold: str,
    reward_min: float = 0.0,
    reward_max: float = 1.0,
    use_math_verify: bool = False,
) -> float:
    """reward_max when the completion's final answer equals ``gold``, else reward_min."""
    ok = answers_match(extract_answer(completion), gold, use_math_verify)
    return reward_max if ok else reward_min
