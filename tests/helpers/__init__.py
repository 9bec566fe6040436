"""The test suites' shared harness, imported as ``tests.helpers.<module>``; conftest files hold
only fixtures.

- ``server``: `vantage serve` processes (the launcher's ``start_server``, and a restartable one)
- ``postgres``: fresh PostgreSQL databases on the maintenance database of the test run
- ``cli``: running the `vantage` command, creating and revoking keys
- ``api``: small calls on the HTTP API (create a run, send steps)
- ``isolation``: what each pytest-xdist worker keeps to itself (user folders)
- ``polling``: waiting for what another process or thread does
- ``alerts``, ``client``, ``dashboard``, ``trainer``: pieces one suite shares among its modules
"""
