"""The Vantage dashboard: a Dash app mounted by the server at /dashboard/ (docs/design.md §2).

``vantage.dashboard.app.mount`` builds it. Importing this package is cheap (it imports nothing:
Dash is imported only with ``app``), and no module of the dashboard imports the package root's
contents, so the package has no import cycle through it.

Layout: ``app`` (mount), ``auth`` (login and gate), ``context`` (each app's state, the caller's
key), ``data`` (reads and writes), ``explain`` (the words), ``components`` and ``figures``
(shared pieces), ``pages/<page>/`` (each page with what only it uses).
"""
