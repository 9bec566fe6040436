"""The bundled arith-tiny run collapses: raw ACR above 0.5 within a few CPU minutes (slow)."""

import pytest
from vantage.trainer.run import fit, setup


@pytest.mark.slow
def test_arith_tiny_collapses_and_avspo_removes_zero_advantage_groups(tmp_path):
    trainer = setup(
        "arith-tiny", [f"output_dir={tmp_path}", "steps=40", "eval_every=0", "progress=false"]
    )
    assert trainer.evaluate() > 0.5  # the SFT warm start taught the format

    def switch_on_collapse(t, record):
        if record["acr"] > 0.5 and t.mitigation.mode == "none":
            t.submit_command("set_mitigation", {"mode": "avspo"})

    summary = fit(trainer, hooks=[switch_on_collapse])
    assert summary["first_step_acr_above_0_5"] is not None
    after = [r for r in summary["history"] if r["mitigation"] == "avspo"]
    assert after and all(r["acr_effective"] == 0.0 for r in after)
