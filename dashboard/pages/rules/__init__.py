"""The rules page (/dashboard/rules): ``page`` (layout and callbacks), its ``table`` and its
``form``."""
