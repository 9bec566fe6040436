"""The alerts page (/dashboard/alerts): ``page`` (layout and callbacks) and its ``table``."""
