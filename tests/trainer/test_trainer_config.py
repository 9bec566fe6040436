"""The config dataclass, YAML files and --set overrides."""

import re

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
        TrainConfig(mitigation="ppo")
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


def test_server_off_trains_unmonitored_even_with_vantage_server_set(monkeypatch):
    """`--set server=` fell back to VANTAGE_SERVER, and `none` was a bad URL (a trial)."""
    from vantage.trainer.monitoring import make_monitor

    monkeypatch.setenv("VANTAGE_SERVER", "http://127.0.0.1:9")
    assert load_config("arith-tiny").server == "http://127.0.0.1:9"
    for off in ("none", "None"):  # (YAML reads `off` as false)
        cfg = load_config("arith-tiny", [f"server={off}"])
        assert cfg.server == "none"
        assert make_monitor(None, cfg.server, {}).monitor is None


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("steps=-1", "steps must be at least 0; got -1"),
        ("steps=3.5", "steps must be an integer; got 3.5"),
        ("group_size=true", "group_size must be an integer; got True"),
        ("temperature=-1", "temperature must be above 0"),
        ("lr=-1", "lr must be from 0 to 1e+30"),
        ("lr=1e300", "lr must be from 0 to 1e+30; got 1e+300"),
        ("lr=.nan", "lr must be from 0 to 1e+30; got nan"),
        ("max_new_tokens=0", "max_new_tokens must be at least 1"),
        ("eval_size=0", "eval_size must be at least 1"),
        ("prompt_template=Q {foo}", "prompt_template 'Q {foo}' cannot be filled (KeyError('foo'))"),
        ("steps={a", "steps must be an integer; got '{a'"),  # no YAML: taken as its text
        # what the server's set_mitigation refuses (the trainer took them and reported them)
        ("avspo_eta=-5", "avspo_eta must be from 0.0 to 1.0; got -5.0"),
        ("avspo_alpha=1000", "avspo_alpha must be from 0.0 to 100.0"),
        ("aapo_delta_high=11", "aapo_delta_high must be from -10.0 to 10.0"),
        ("seed=18446744073709551616", "seed must be from 0 to 4294967295"),
        ("prompts_per_step=-3", "prompts_per_step must be from 1 to 10000"),
        ("prompts_per_step=20000", "prompts_per_step must be from 1 to 10000; got 20000"),
        ("top_p=1.5", "top_p must be from 0 to 1"),
        ("progress=maybe", "progress must be true or false"),
        ("run_name=[1]", "run_name must be a string"),
        ("arith_operators=/", "arith_operators must be some of"),
        ("aapo_delta_low=0.5", "aapo_delta_low must not exceed aapo_delta_high"),
        ("kl_beta=.inf", "kl_beta must be a finite number"),
        ("adam_betas=[0.9]", "adam_betas must be two numbers in [0, 1); got [0.9]"),
        ("adam_betas=[2,0.5]", "adam_betas must be two numbers in [0, 1)"),
        ("tiny_heads=3", "tiny_hidden_size (256) must be a multiple of tiny_heads (3)"),
        ("tiny_max_positions=4", "tiny_max_positions (4) must exceed max_new_tokens"),
        ("steps=", "steps needs a value"),
        ("temperature=11", "the temperature must be a number from 0.01 to 10; got 11.0"),
        ("temperature=1e-50", "the temperature must be a number from 0.01 to 10; got 1e-50"),
        ("run_name=../../escape", "cannot name a folder under runs/"),
    ],
)
def test_values_that_cannot_work_are_refused_naming_the_field(override, says):
    """Checked when the config loads, before any model is built (they used to run, or fail
    deep inside transformers after the model was loaded)."""
    with pytest.raises(ValueError, match=re.escape(says)):
        load_config("arith-tiny", [override])


def test_a_config_file_gets_its_own_run_name_and_folder(tmp_path):
    """A config without run_name and output_dir never shares the default folder (and so never
    resumes a checkpoint that another config left there)."""
    path = tmp_path / "my-run.yaml"
    path.write_text("group_size: 4\nsteps: 5\n")
    cfg = load_config(path)
    assert (cfg.run_name, cfg.output_dir) == ("my-run", "runs/my-run")
    # the folder follows the run name, unless the file or an override names one
    assert load_config(path, ["run_name=x"]).output_dir == "runs/x"
    assert load_config("arith-tiny", ["run_name=x"]).output_dir == "runs/x"
    assert load_config(None, ["run_name=x"]).output_dir == "runs/x"
    assert load_config(path, ["run_name=x", "output_dir=o"]).output_dir == "o"
    path.write_text("run_name: named\noutput_dir: there\n")
    assert load_config(path, ["run_name=x"]).output_dir == "there"
    path.write_text("run_name: named\n")
    assert load_config(path).output_dir == "runs/named"


def test_unreadable_config_files_get_one_line(tmp_path):
    bad = tmp_path / "b.yaml"
    bad.write_text("steps: [unclosed\n")
    with pytest.raises(ValueError, match=r"not valid YAML: .* \(line 2, column 1\)"):
        load_config(bad)
    with pytest.raises(ValueError, match="is not a file"):
        load_config(tmp_path)
    # PyYAML keeps the last of two equal keys: an edit above it was undone silently
    bad.write_text("steps: 3\ngroup_size: 4\nsteps: 100\n")
    with pytest.raises(ValueError, match=r"key 'steps' is given twice \(line 3, column 1\)"):
        load_config(bad)
    bad.write_text("? [a]\n: 1\n")  # a TypeError's traceback
    with pytest.raises(ValueError, match="a key must be a name, not a list"):
        load_config(bad)


def test_vantage_train_says_a_user_mistake_in_one_line(tmp_path, capsys):
    import torch
    from vantage.trainer.run import main

    bad = tmp_path / "b.yaml"
    bad.write_text("steps: [unclosed\n")
    cases = [[str(bad)], [str(tmp_path)], ["arith-tiny", "--set", "prompts_per_step=-3"]]
    # init_checkpoint that is no local checkpoint folder: missing, a file, empty, a hub name
    # (transformers' tracebacks, and for the hub name a request to the hub: a trial)
    (tmp_path / "empty").mkdir()
    for where in (tmp_path / "nope", bad, tmp_path / "empty", "someorg/somemodel"):
        out = f"output_dir={tmp_path / 'ckpt-run'}"
        cases.append(["arith-tiny", "--set", f"init_checkpoint={where}", "--set", out])
    if not torch.cuda.is_available():
        out = f"output_dir={tmp_path / 'run'}"
        cases.append(["arith-tiny", "--set", "device=cuda", "--set", out])
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("vantage train: ") and len(err.splitlines()) == 1, err
        if any(a.startswith("init_checkpoint") for a in argv):
            assert "not a local Hugging Face checkpoint folder" in err, err
    assert "sees no CUDA device" in err or torch.cuda.is_available()


def test_an_override_that_is_no_yaml_is_its_text(tmp_path):
    """`--set 'prompt_template={question} ='` raised the YAML parser's traceback (a trial)."""
    assert load_config("arith-tiny", ["prompt_template={question} ="]).prompt_template == (
        "{question} ="
    )


def test_an_output_dir_that_cannot_be_written_is_one_line_before_any_model_loads(tmp_path):
    from vantage.trainer.run import setup

    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(ValueError, match="output_dir .*a-file cannot be written: File exists"):
        setup("arith-tiny", [f"output_dir={taken}"])


def test_an_override_given_twice_or_a_server_that_is_no_url_is_refused(monkeypatch):
    """`--set steps=1 --set steps=2` trained 2 steps without a word; `server=notaurl` trained
    the whole run into a spool, said only at the end (a trial)."""
    with pytest.raises(
        ValueError, match="override of 'steps' given twice: 'steps=1' and 'steps=2'"
    ):
        load_config("arith-tiny", ["steps=1", "steps=2"])
    for bad in ("notaurl", "127.0.0.1:8000", "ftp://host/"):
        with pytest.raises(ValueError, match=r"server .* is not an http:// or https:// URL"):
            load_config("arith-tiny", [f"server={bad}"])
    monkeypatch.setenv("VANTAGE_SERVER", "localhost")
    with pytest.raises(ValueError, match="else VANTAGE_SERVER"):
        load_config("arith-tiny")
    assert load_config("arith-tiny", ["server=none"]).server == "none"
    assert load_config("arith-tiny", ["server=http://127.0.0.1:8000"]).server.startswith("http")


def test_a_run_identity_the_server_would_refuse_is_refused_before_training():
    """A 300-character project turned monitoring off for the whole run, with no spool to sync
    (a trial): the config now refuses it, naming the field."""
    for field, value in (
        ("project", "p" * 300),
        ("run_name", "n" * 230),
        ("run_id", "i" * 300),
        ("run_name", "two\nlines"),
    ):
        with pytest.raises(ValueError, match=rf"^{field}: .*\(as the Vantage server takes it\)"):
            TrainConfig(server="none", **{field: value})
