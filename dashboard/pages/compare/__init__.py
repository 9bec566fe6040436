"""The compare page (/dashboard/compare): ``page`` (layout and callback), its ``figures`` and
its ``table``."""
