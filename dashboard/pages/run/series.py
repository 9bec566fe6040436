"""The series of the run page's live charts: trace ``i`` of a figure is series ``i`` whatever
the data, so a live update appends new steps to trace ``i`` with a ``Patch`` (`extend_patch`)
instead of rebuilding the figure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vantage.dashboard.figures import COLORS, Point, plotly_text


def _field(name: str) -> Callable[[Point], Any]:
    return lambda p: p.get(name)


def _share(name: str) -> Callable[[Point], Any]:
    """A share of groups, to 4 decimals (1 group in 10,000): halves the figure's bytes."""

    def value(p: Point) -> Any:
        v = p.get(name)
        return None if v is None else round(v, 4)

    return value


def _scalar(name: str) -> Callable[[Point], Any]:
    """A trainer scalar; a non-finite one (stored as "NaN", "Infinity" or "-Infinity") is a gap
    in its line, and `non_finite_scalar` names it in the chart's title."""

    def value(p: Point) -> Any:
        v = (p.get("scalars") or {}).get(name)
        return None if isinstance(v, str) else v

    return value


_reward_std = _scalar("reward_std")


def has_reward_std(points: Iterable[Point]) -> bool:
    """Whether any point carries the trainer's ``reward_std`` (the reward band's width)."""
    return any(_reward_std(p) is not None for p in points)


Bounds = tuple[float | None, float | None]
"""A run's (reward_min, reward_max): no reward lies outside them (None: unbounded)."""


def _reward_edge(sign: int, bounds: Bounds = (None, None)) -> Callable[[Point], Any]:
    """The band's lower (``sign`` −1) or upper (+1) edge, mean ∓ std, kept within the run's
    reward ``bounds``: a 0/1 reward at mean 0.9 drew its band up to 1.2, a reward no
    completion can get."""
    low, high = bounds

    def edge(p: Point) -> Any:
        mean, std = p.get("reward_mean"), _reward_std(p)
        if mean is None or std is None:  # no band here: it narrows to the mean (a null in one
            return mean  # edge only, filled to the other edge, drew a triangle)
        value = mean + sign * std
        if low is not None and value < low:
            return low
        return high if high is not None and value > high else value

    return edge


@dataclass(frozen=True)
class Series:
    """One trace of a live chart: its label, how to read a point, how to draw it."""

    key: str
    label: str
    value: Callable[[Point], Any]
    hover: str
    style: dict = field(default_factory=dict)


def _hover(label: str, hint: str, digits: str = ".2f") -> str:
    return f"step %{{x}}<br>{label}: %{{y:{digits}}}<br><i>{hint}</i><extra></extra>"


ACR_SERIES: tuple[Series, ...] = (
    Series(
        "acr_all_fail",
        "all-fail share",
        _share("acr_all_fail"),
        _hover("all-fail share", "every completion wrong: prompts too hard"),
        {
            "stackgroup": "sides",
            "stackgaps": "interpolate",
            "line": {"width": 0},
            "fillcolor": COLORS["all_fail"],
        },
    ),
    Series(
        "acr_all_pass",
        "all-pass share",
        _share("acr_all_pass"),
        _hover("all-pass share", "every completion right: prompts too easy"),
        {
            "stackgroup": "sides",
            "stackgaps": "interpolate",
            "line": {"width": 0},
            "fillcolor": COLORS["all_pass"],
        },
    ),
    Series(
        "acr_constant",
        "constant-reward share",
        _share("acr_constant"),
        _hover("constant share", "same non-pass/fail reward: check the reward function"),
        {
            "stackgroup": "sides",
            "stackgaps": "interpolate",
            "line": {"width": 0},
            "fillcolor": COLORS["constant"],
        },
    ),
    Series(
        "expected_acr",
        "expected ACR (lower bound)",
        _share("expected_acr"),
        _hover("expected ACR", "what chance alone gives at this pass rate"),
        {"line": {"color": COLORS["expected_acr"], "dash": "dot", "width": 1.5}},
    ),
    Series(
        "acr_eps",
        "ACR incl. near-collapsed",
        _share("acr_eps"),
        _hover("ACR (eps)", "also counts groups whose rewards barely differ"),
        {"line": {"color": COLORS["acr_eps"], "dash": "dash", "width": 1.2}},
    ),
    Series(
        "acr_effective",
        "effective ACR (after mitigation)",
        _share("acr_effective"),
        _hover("effective ACR", "zero-advantage groups left after AVSPO/AAPO"),
        {"line": {"color": COLORS["acr_effective"], "width": 2.5}},
    ),
    Series(
        "acr",
        "ACR",
        _share("acr"),
        _hover("ACR", "share of groups with no gradient; > 0.35 for long = stalled"),
        {"line": {"color": COLORS["acr"], "width": 2}},
    ),
)


def reward_series(bounds: Bounds = (None, None)) -> tuple[Series, ...]:
    """The reward chart's series (band's lower edge, upper edge, mean), the band kept within
    a run's reward ``bounds`` (`run_bounds`)."""
    return (
        Series(
            "reward_low",
            "mean − std",
            _reward_edge(-1, bounds),
            _hover("mean − std", "spread of rewards"),
            {"line": {"width": 0}, "showlegend": False, "connectgaps": True},
        ),
        Series(
            "reward_high",
            "reward ± std",
            _reward_edge(+1, bounds),
            _hover("mean + std", "spread of rewards"),
            {
                "line": {"width": 0},
                "fill": "tonexty",
                "fillcolor": COLORS["band"],
                "connectgaps": True,
            },
        ),
        Series(
            "reward_mean",
            "reward mean",
            _field("reward_mean"),
            _hover("reward mean", "a sudden drop is a failure: check KL and the latest checkpoint"),
            {"line": {"color": COLORS["reward"], "width": 2}},
        ),
    )


def run_bounds(run: dict | None) -> Bounds:
    """A run's reward bounds as the API gives them (``reward_min``, ``reward_max``)."""
    run = run or {}
    return run.get("reward_min"), run.get("reward_max")


REWARD_SERIES = reward_series()

SCALAR_SERIES: tuple[Series, ...] = (
    Series(
        "eval_accuracy",
        "eval accuracy",
        _scalar("eval_accuracy"),
        _hover("eval accuracy", "held-out accuracy: whether the policy still learns", ".3g"),
    ),
    Series("loss", "loss", _scalar("loss"), _hover("loss", "policy loss", ".4g")),
    Series("kl", "KL", _scalar("kl"), _hover("KL", "distance from the reference model", ".4g")),
    Series(
        "entropy",
        "entropy",
        _scalar("entropy"),
        _hover("entropy", "falling towards 0: samples lose diversity, collapse follows", ".4g"),
    ),
    Series(
        "temperature",
        "temperature",
        _scalar("temperature"),
        _hover("temperature", "sampling temperature", ".3g"),
    ),
)


def series_xy(points: Iterable[Point], series: Sequence[Series]) -> list[tuple[list, list]]:
    """Per series, the steps and values of ``points`` (None where a value is missing). A
    stacked area leaves out the points it has no value at: Plotly draws a stack's leading
    gap at its first value, and step 0 (the baseline accuracy, no groups) was shaded as
    step 1's shares."""
    points = points if isinstance(points, list) else list(points)
    steps = [p["step"] for p in points]
    out = []
    for s in series:
        values = [s.value(p) for p in points]
        if "stackgroup" in s.style:
            kept = [i for i, v in enumerate(values) if v is not None]
            out.append(([steps[i] for i in kept], [values[i] for i in kept]))
        else:
            out.append((steps, values))
    return out


MAX_SCALAR_CHARTS = 4
NOT_CHARTED = frozenset({"reward_std"})  # drawn as the reward chart's band


def scalar_names(points: Iterable[Point]) -> list[str]:
    """Every scalar logged in ``points`` that the chart may draw: the well-known ones first
    (held-out accuracy, loss, KL, entropy, temperature), then the others by name."""
    return ordered_names({name for p in points for name in (p.get("scalars") or {})})


def ordered_names(logged: set[str]) -> list[str]:
    """`scalar_names` of the set of names logged (one pass over the points, done by the
    caller)."""
    seen = logged - NOT_CHARTED
    known = [s.key for s in SCALAR_SERIES if s.key in seen]
    return known + sorted(seen - set(known))


def scalar_series(names: Sequence[str], limit: int = MAX_SCALAR_CHARTS) -> tuple[Series, ...]:
    """The series of the first ``limit`` of ``names`` (`scalar_names`)."""
    known = {s.key: s for s in SCALAR_SERIES}
    return tuple(known.get(n) or _logged_series(n) for n in names[:limit])


def _logged_series(name: str) -> Series:
    """The series of a scalar the dashboard knows nothing of: its name, as text."""
    label = plotly_text(name)
    return Series(name, label, _scalar(name), _hover(label, "as the trainer logged it", ".4g"))


def extend_patch(patch: Any, points: Sequence[Point], series: Sequence[Series]) -> int:
    """Append ``points`` to the traces of ``series`` in a ``dash.Patch``; returns how many."""
    if not points:
        return 0
    for i, (xs, ys) in enumerate(series_xy(points, series)):
        patch["data"][i]["x"].extend(xs)
        patch["data"][i]["y"].extend(ys)
    return len(points)
