"""Vantage's bundled GRPO trainer (docs/design.md §7), streaming to the server through the client
hook.

Entry points (``vantage train CONFIG [--set key=value ...]`` calls ``run.main``):

    from vantage.trainer.run import train, setup, fit
    summary = train("arith-tiny", ["steps=100", "mitigation=avspo"])   # whole job, returns a dict
    trainer = setup("arith-tiny", ["server=http://127.0.0.1:8000"])    # or hold the trainer:
    trainer.submit_command("set_mitigation", {"mode": "avspo"})        # at the next boundary
    summary = fit(trainer, hooks=[lambda trainer, record: print(record["acr"])])

Modules: ``config`` (the one dataclass), ``advantages`` (grpo/avspo/aapo/dapo, pure, and their
registry), ``mitigation`` (the estimator in effect), ``commands`` (applied at a step boundary),
``models``, ``data``, ``rewards``, ``rollout`` (HF generate, vLLM), ``sft``, ``loss``, ``grpo``
(the step), ``monitoring`` (Monitor adapter), ``distributed`` (torch.distributed helpers),
``checkpoint``, ``resume``, ``signals``, ``run`` (setup and fit).
Nothing is imported here, so ``import vantage.trainer`` stays cheap.
"""
