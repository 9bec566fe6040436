"""The scalars chart's views, the compare page's side-by-side tables and the samples view:
pure builders, plain data in and out (issue 42 items 5 and 6)."""

from __future__ import annotations

import plotly.graph_objects as go
from dash import Patch
from vantage.dashboard.pages.compare import side_by_side
from vantage.dashboard.pages.run import figures, prompts
from vantage.dashboard.pages.run import scalars as views


def point(step: int, **scalars: float) -> dict:
    return {"step": step, "time": 1_700_000_000.0 + 60 * step, "scalars": scalars}


POINTS = [point(0, loss=1.0, kl=0.1, lr=1.0), point(1, loss=3.0, kl=0.2), point(2, loss=2.0)]


def test_a_view_from_the_controls_takes_only_what_it_can_draw():
    assert views.normal_view() == views.DEFAULT_VIEW
    view = views.normal_view(["kl", 3, "kl", "lr"], 1.5, ["log"], "time")
    assert view == {"names": ["kl", "lr"], "smoothing": 0.99, "log": True, "x": "time"}
    odd = views.normal_view("kl", float("nan"), "yes", "walltime")  # a hand-built request
    assert odd == views.DEFAULT_VIEW
    assert len(views.normal_view([f"s{i}" for i in range(20)])["names"]) == views.MAX_PICKED


def test_smoothing_is_an_ema_that_skips_gaps_and_continues():
    # s = 0.5·s_prev + 0.5·v: 1 → 1; gap; 3 → 2; 5 → 3.5
    assert views.smooth([1.0, None, 3.0, 5.0], 0.5) == ([1.0, None, 2.0, 3.5], 3.5)
    assert views.smooth([5.0], 0.5, last=3.0) == ([4.0], 4.0)


def test_the_chosen_scalars_are_drawn_smoothed_on_a_log_scale_by_wall_time():
    view = views.normal_view(["kl", "lr", "loss"], 0.5, ["log"], "time")
    fig = figures.scalars_figure(POINTS, view)
    go.Figure(fig)  # valid for Plotly
    names = [t["name"] for t in fig["data"]]
    assert names == ["KL", "KL, smoothed", "lr", "lr, smoothed", "loss", "loss, smoothed"]
    raw, smoothed = fig["data"][4], fig["data"][5]
    assert raw["opacity"] == 0.3 and raw["y"] == [1.0, 3.0, 2.0]
    assert smoothed["y"] == [1.0, 2.0, 2.0]
    assert raw["x"][0] == "2023-11-14T22:13:20+00:00"  # wall time, UTC
    assert fig["layout"]["xaxis3"]["type"] == "date" and fig["layout"]["yaxis2"]["type"] == "log"
    assert "smoothed 0.5" in fig["layout"]["title"]["text"]
    five = figures.scalars_figure(POINTS, views.normal_view(["a", "b", "c", "d", "e"]))
    assert five["layout"]["height"] == figures.SCALARS_HEIGHT + views.ROW_HEIGHT  # 3 rows


def test_live_appends_continue_the_smoothed_line():
    view = views.normal_view(["loss"], 0.5)
    ema = views.ema_state(POINTS[:2], ["loss"], view)
    assert ema == {"loss": 2.0}
    patch = Patch()
    ema = views.extend(patch, POINTS[2:], ["loss"], view, ema)
    assert ema == {"loss": 2.0}  # 0.5·2 + 0.5·2
    ops = {
        tuple(op["location"]): op["params"]["value"] for op in patch.to_plotly_json()["operations"]
    }
    assert ops[("data", 0, "y")] == [2.0] and ops[("data", 1, "y")] == [2.0]
    assert ops[("data", 1, "x")] == [2]


def test_the_config_diff_flattens_nested_keys_and_shows_only_what_differs():
    a = {"lr": 1e-4, "model": {"name": "qwen", "layers": 4}, "tags": [1, 2], "seed": 1}
    b = {"lr": 1e-4, "model": {"name": "qwen", "layers": 8}, "tags": [1, 2], "gpus": 8}
    differ, same = side_by_side.config_diff([a, b])
    assert same == 3  # lr, model.name, tags
    assert [k for k, _ in differ] == ["gpus", "model.layers", "seed"]
    gpus = dict(differ)["gpus"]
    assert gpus[0] is side_by_side.MISSING and gpus[1] == 8
    assert len(side_by_side.config_diff([a, None])[0]) == 5  # a run without a config lacks all
    text = str(
        side_by_side.config_table([{"run_id": "r1", "config": a}, {"run_id": "r2", "config": b}])
    )
    assert "model.layers" in text and "3 are the same" in text


def test_the_side_by_side_table_has_a_column_per_run():
    runs = [
        {"run_id": "r1", "name": "grpo", "last_step": 9, "latest_acr": 0.5},
        {"run_id": "r2", "name": "avspo", "last_step": 9, "latest_acr": 0.4},
    ]
    result = {
        "runs": runs,
        "windows": {"r1": {"acr_pooled": 0.5}, "r2": {"acr_pooled": 0.42}},
        "totals": {"r1": {"steps": 10, "wasted_rollouts": 640}, "r2": {"steps": 10}},
        "metrics": {"r1": [{"step": 9, "reward_mean": 0.61}, {"step": 10}], "r2": []},
    }
    text = str(side_by_side.metrics_table(result))
    assert "0.420" in text and "640" in text and "0.610" in text  # the last reward that exists


def test_a_prompts_samples_show_each_completion_beside_its_reward():
    sample = {"step": 7, "split": "train", "prompt": "2+2=", "completions": ["4", "5\u202e"],
              "rewards": [1.0, "NaN"]}  # fmt: skip
    text = str(prompts.samples_view("p1", [sample]))
    assert "What did the model answer?" in text and "step 7" in text
    assert "1.000" in text and "<U+202E>" in text  # a bidi control is shown, not obeyed
    assert "log_samples" in str(prompts.samples_view("p1", []))
