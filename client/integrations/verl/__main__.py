"""``python -m vantage.client.integrations.verl <hydra overrides>`` (see ``launch``)."""

from .launch import main

main()
