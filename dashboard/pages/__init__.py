"""The dashboard's pages, one package each: ``page.py`` registers the page with Dash Pages and
holds its layout and callbacks; the modules beside it are what only that page uses.

Dash runs every ``page.py`` afresh for each app it builds (tests build several in one process),
which registers the page's callbacks again; so callbacks stay in ``page.py``, and ``page.py``
imports with absolute names (Dash loads it under a module name of its own)."""
