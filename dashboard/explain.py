"""Plain-language text for every number the dashboard shows: what it means, what to do about it.

Kept in one place so that the cards, the chart hovers and the tests read the same words. The
ACR → accuracy regression of the literature is deliberately absent: it held for one setting and
is never shown as a prediction for other runs (docs/design.md §1).
"""

from __future__ import annotations

import json
import math
from decimal import ROUND_HALF_UP, Decimal, localcontext

from vantage.client.schema import BIDI_CONTROLS

STALL_THRESHOLD = 0.35

ACR = (
    "Advantage collapse rate: the share of this step's prompt groups in which every completion "
    "got the same reward. Such a group has zero advantage and teaches the model nothing. Published "
    "GRPO runs on math sit around 0.28-0.45; above 0.35 for 50+ steps a run is usually stalled: "
    "try AVSPO or AAPO, or make the prompts harder or easier."
)
ACR_EPS = (
    "ACR counting near-collapsed groups too (rewards differ, but so little that the normalised "
    "advantages are below the tolerance). A gap to ACR means rewards barely differ within groups."
)
ACR_EFFECTIVE = (
    "Share of groups whose advantages are still zero after the trainer's mitigation (AVSPO/AAPO). "
    "Below ACR means the mitigation is restoring gradient signal."
)
EXPECTED_ACR = (
    "Lower bound: the ACR expected if every prompt had the step's pooled pass rate. ACR far above "
    "it means some prompts are far too easy or too hard for the policy (or samples lack "
    "diversity); close to it means collapse is just chance at this pass rate."
)
ALL_PASS = "Groups where every completion passed: these prompts are too easy for the policy now."
ALL_FAIL = "Groups where every completion failed: these prompts are too hard for the policy now."
CONSTANT = (
    "Groups where every completion got the same reward that is neither pass nor fail: check the "
    "reward function (it may return a constant)."
)
ACR_100 = (
    "Mean ACR over the first 100 steps with data (empty until 100 exist). High early collapse "
    "(> 0.5) means the task does not fit the starting policy; it is a diagnostic, not a forecast "
    "of final accuracy."
)
ACR_EMA = (
    "Exponential moving average of ACR (half-life 20 steps): the trend without step-to-step noise. "
    "Rising: collapse is getting worse. Once a mitigation acts, its colour follows the effective "
    "ACR, what the policy learns from."
)
ACR_STREAK = (
    "Consecutive latest steps with ACR above 0.35. Over 50 steps the run is likely stalled: "
    "switch on a mitigation or change the data."
)
WASTED = (
    "Share of sampled completions that were in collapsed groups: rollout compute that produced no "
    "gradient. Lower it by mitigating collapse or filtering prompts that are always solved or "
    "always failed. It is counted before the trainer's mitigation: AVSPO and AAPO give some of "
    "these groups a gradient after all, which the effective ACR shows, and whose colour the card "
    "then takes."
)
EVAL = (
    "The evaluation split's collapse and reward (groups the trainer sent with split 'eval'). "
    "An eval set that turns all-pass has nothing left to show; all-fail, the task is too hard."
)

REWARD_MEAN = (
    "Mean reward of the completions of the latest step. A sudden drop mid-training is the other "
    "failure to watch: check the latest checkpoint, KL and learning rate."
)
PASS_RATE = "Share of completions that got the maximum reward (binary rewards only)."

KPI_HELP = {
    "acr": ACR,
    "acr_100": ACR_100,
    "acr_ema": ACR_EMA,
    "acr_streak": ACR_STREAK,
    "wasted": WASTED,
    "reward_mean": REWARD_MEAN,
    "steps_per_min": (
        "Training speed over the latest steps ('—' until two steps carry times at least a "
        "second apart). With status "
        "'stale' the trainer stopped sending data: check the job."
    ),
}

STATUS_HELP = {
    "running": "Data arrived recently.",
    "stale": "No data or heartbeat for a while: the trainer may have crashed or hung.",
    "finished": "The trainer reported a clean finish.",
    "failed": "The trainer reported a failure.",
}

COMMAND_HELP = {
    "avspo": (
        "AVSPO adds virtual rewards to collapsed groups' mean and std so they give gradient again; "
        "no extra rollouts. Applied by the trainer at the next step boundary."
    ),
    "aapo": (
        "AAPO adds an advantage margin against a frozen reference model's rewards for the same "
        "prompt; costs reference samples."
    ),
    "dapo": (
        "DAPO dynamic sampling drops collapsed groups from the training batch and samples more "
        "prompts to refill it; costs extra rollouts."
    ),
    "none": "Plain GRPO advantages: switch mitigation off.",
    "temperature": "Sampling temperature: higher gives more diverse completions, fewer collapses.",
    "checkpoint": "Ask the trainer to save a checkpoint at the next step boundary.",
    "stop": "Ask the trainer to stop cleanly at the next step boundary.",
}


def fmt(value, digits: int = 2) -> str:
    """A number for a card: fixed digits, or an em dash for a missing value. A tie rounds up,
    as the charts' hover labels (JavaScript's toFixed) do: ACR 0.625 was 0.62 on its card and
    0.63 under the cursor (Python's format rounds a tie to even)."""
    if value is None:
        return "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    if not math.isfinite(number):
        return f"{number}"
    if abs(number) >= 1e6:  # 3.87e+18 steps a minute (steps that jumped), and 2221330.5 of a
        return f"{number:.3g}"  # burst, ran off or wrapped in their card
    with localcontext(prec=400):  # enough digits for any float's integer part
        rounded = Decimal(number).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP)
    return f"{rounded:.{digits}f}"


def visible(text: str) -> str:
    """``text`` with its bidirectional controls shown as ``<U+202E>`` (a prompt id holding
    U+202E is drawn backwards otherwise; run names refuse them)."""
    return "".join(f"<U+{ord(c):04X}>" if c in BIDI_CONTROLS else c for c in text)


PRIMER = (
    (
        "What is advantage collapse?",
        "GRPO samples several completions per prompt (a group) and learns from how their rewards "
        "differ. When every completion of a group gets the same reward, all right or all wrong, "
        "the group's advantages are zero and it teaches the model nothing: that rollout compute "
        "is wasted. ACR is the share of a step's groups where this happened.",
    ),
    (
        "How do I read the ACR chart?",
        "The black line is ACR per step. The shaded area splits it: light blue groups were all "
        "right (prompts too easy), orange all wrong (too hard), grey a constant reward (check "
        "the reward function). The dotted green line is what chance alone would give at the "
        "current pass rate; ACR far above it means the prompt mix no longer fits the policy. "
        "The pink line is the effective ACR, after a mitigation gave collapsed groups a "
        "gradient again. Shaded bands show when a mitigation was on (mint green AVSPO, yellow "
        "AAPO, pink DAPO), each named above the chart; red triangles show alerts.",
    ),
    (
        "What should I do when it is high?",
        "Above 0.35 for 50+ steps a run has usually stalled. Switch on AVSPO (no extra rollouts) "
        "or AAPO below, raise the sampling temperature for more diverse completions, or change "
        "the data: drop prompts that are always solved, move always-failed ones later. Watch "
        "the effective ACR (pink) fall and the reward keep rising.",
    ),
    (
        "What these numbers do not say",
        "Published work found early ACR related to final accuracy for one model family on one "
        "benchmark. That finding does not transfer to your run: nothing here predicts accuracy.",
    ),
)


def settings_text(params: dict, skip: tuple[str, ...] = ()) -> list[str]:
    """``key=value`` for each of a command's or mitigation's settings but those in ``skip``; a
    value that is not text as JSON (a nested setting the trainer reported read as a Python
    dict, ``{'a': 1}``, in the run's header); bidirectional controls shown (`visible`:
    the trainer's own names and values are not checked for them)."""

    def shown(v: object) -> str:
        return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)

    return [visible(f"{k}={shown(v)}") for k, v in params.items() if k not in skip]
