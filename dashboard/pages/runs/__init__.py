"""The runs page (/dashboard/): ``page`` (layout and callback) and the runs ``table``."""
