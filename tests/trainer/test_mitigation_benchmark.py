"""benchmarks/mitigation.py's arithmetic on hand-made run summaries (issue 43 item 2): the curves
against steps, completions and training seconds, the means over seeds, and which gaps to GRPO
exceed the spread across seeds. The training it aggregates is the trainer's, tested elsewhere."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "mitigation.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("mitigation_benchmark", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summary(accuracies: list[float], rollouts: list[float], acr: float = 0.5) -> dict:
    """Two steps of 1.5 s, evaluated at steps 0, 1 and 2."""
    history = [
        {"step": step, "rollouts_per_step": r, "step_s": 1.5}
        for step, r in zip((1, 2), rollouts, strict=True)
    ]
    return {
        "evals": list(zip((0, 1, 2), accuracies, strict=True)),
        "history": history,
        "accuracy_final": accuracies[-1],
        "acr_mean": acr,
        "acr_effective_mean": 0.0,
        "step_s_mean": 1.5,
    }


def test_curve_counts_the_completions_and_seconds_up_to_each_evaluation(bench):
    curve = bench.curve(_summary([0.1, 0.2, 0.4], [128, 384]))
    assert curve == [[0, 0, 0, 0.1], [1, 128, 1.5, 0.2], [2, 512, 3.0, 0.4]]


def test_aggregate_means_over_seeds_and_gaps_paired_by_seed(bench):
    grpo = bench.aggregate(
        [_summary([0.1, 0.2, 0.4], [128, 128]), _summary([0.1, 0.2, 0.6], [128, 128])]
    )
    assert grpo["accuracy"] == pytest.approx(0.5)
    assert grpo["accuracy_std"] == pytest.approx(0.1414213562)  # sample std of 0.4 and 0.6
    assert grpo["rollouts_per_step"] == 128
    assert grpo["curve"][2] == pytest.approx([2, 256, 3.0, 0.5, 0.1414213562])
    # +0.1 in each seed: beyond the gaps' spread (0) though within GRPO's own spread (0.14)
    steady = bench.aggregate(
        [_summary([0.1, 0.2, 0.5], [128, 384]), _summary([0.1, 0.2, 0.7], [128, 384])]
    )
    # +0.3 and -0.1: a mean gap of 0.1 within the gaps' spread (0.28)
    mixed = bench.aggregate(
        [_summary([0.1, 0.2, 0.7], [384, 384]), _summary([0.1, 0.2, 0.5], [384, 384])]
    )
    result = {"grpo": {"r": grpo}, "dapo": {"r": steady}, "avspo": {"r": mixed}}
    bench.compare_to_grpo(result, "r")
    assert steady["rollouts_per_step"] == 256
    assert steady["accuracy_vs_grpo"] == pytest.approx(0.1)
    assert steady["accuracy_vs_grpo_std"] == pytest.approx(0.0, abs=1e-12)
    assert steady["beyond_spread"] is True
    assert mixed["accuracy_vs_grpo"] == pytest.approx(0.1)
    assert mixed["accuracy_vs_grpo_std"] == pytest.approx(0.2828427125)
    assert mixed["beyond_spread"] is False
    assert grpo["accuracy_vs_grpo"] == 0 and grpo["beyond_spread"] is False


def test_a_kept_run_stands_in_only_with_the_same_settings(bench, tmp_path):
    """An interrupted benchmark goes on with the runs a kept --workdir finished."""
    import json

    cfg = {key: 1 for key in bench.SAME} | {"output_dir": str(tmp_path), "steps": 2}
    assert bench.kept_run(cfg) is None  # nothing there
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert bench.kept_run(cfg) is None  # started, not finished
    (tmp_path / "summary.json").write_text(json.dumps({"steps_completed": 2}))
    assert bench.kept_run(cfg) == {"steps_completed": 2}
    assert bench.kept_run({**cfg, "lr": 2}) is None
    assert bench.kept_run({**cfg, "steps": 3}) is None
