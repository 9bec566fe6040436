"""The config dataclass, YAML files and --set overrides."""

import pytest
from vantage.trainer.config import CONFIG_DIR, TrainConfig, load_config


@pytest.mark.parametrize("name", ["arith-tiny", "smollm2-arith", "gsm8k-gpu"])
def test_bundled_configs_load(name):
    cfg = load_config(name)
    assert cfg.run_name == name
    assert (CONFIG_DIR / f"{name}.yaml").exists()


def test_overrides_are_typed(tmp_path):
    cfg = load_config(
        "arith-tiny",
        [
            "steps=7",
            "lr=3e-4",
            "progress=false",
            "mitigation=avspo",
            "adam_betas=[0.9, 0.95]",
            "model_path=",
        ],
    )
    assert cfg.steps == 7 and isinstance(cfg.steps, int)
    assert cfg.lr == 3e-4 and cfg.progress is False and cfg.mitigation == "avspo"
    assert cfg.adam_betas == (0.9, 0.95) and cfg.model_path is None
    path = tmp_path / "c.yaml"
    path.write_text("steps: 3\ngroup_size: 4\n")
    assert load_config(path, ["group_size=6"]).group_size == 6


def test_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="unknown config field 'stepz'"):
        load_config("arith-tiny", ["stepz=3"])
    with pytest.raises(ValueError, match="not key=value"):
        load_config("arith-tiny", ["steps"])
    with pytest.raises(ValueError, match="mitigation must be one of"):
        TrainConfig(mitigation="dapo")
    with pytest.raises(ValueError, match="group_size"):
        TrainConfig(group_size=1)
    with pytest.raises(ValueError, match="data_path"):
        TrainConfig(task="jsonl")
    with pytest.raises(FileNotFoundError, match="bundled"):
        load_config("no-such-config")
    bad = tmp_path / "bad.yaml"
    bad.write_text("stepz: 3\n")
    with pytest.raises(ValueError, match="stepz"):
        load_config(bad)


def test_every_field_has_a_comment():
    source = (CONFIG_DIR.parent / "config.py").read_text()
    body = source.split("class TrainConfig:")[1].split("def __post_init__")[0]
    for line in body.splitlines():
        if ": " in line and "=" in line and not line.strip().startswith("#"):
            assert "#" in line, f"config field without a comment: {line.strip()}"


def test_api_key_is_not_in_the_run_config():
    assert "api_key" not in TrainConfig(api_key="vtg_secret").to_dict()
