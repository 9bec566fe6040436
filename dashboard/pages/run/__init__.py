"""The run page (/dashboard/runs/<run_id>): ``page`` (layout and callbacks), ``view`` (what the
data callback returns), ``banner``, ``kpis``, ``figures`` with its ``series`` and ``shapes``,
``command_panel``, ``command_log`` and ``prompts``."""
