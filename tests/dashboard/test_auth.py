"""Login, cookies (docs/design.md §8), the gate in front of pages and callbacks, CSV downloads."""

from __future__ import annotations

import sqlite3
from contextlib import contextmanager

import httpx
import orjson


def client(dashboard_server, **kw) -> httpx.Client:
    return httpx.Client(base_url=dashboard_server.url, timeout=30, follow_redirects=False, **kw)


@contextmanager
def logged_in(dashboard_server, key_name: str):
    """A client holding the login cookie of one of the server's keys."""
    with client(dashboard_server) as c:
        r = c.post(
            "/dashboard/login", data={"key": dashboard_server.keys[key_name], "next": "/dashboard/"}
        )
        assert r.status_code == 303
        yield c


def test_the_favicon_browsers_ask_for_is_found(dashboard_server):
    with client(dashboard_server) as c:
        r = c.get("/favicon.ico", follow_redirects=True)
        assert r.status_code == 200 and r.content and r.url.path == "/dashboard/_favicon.ico"


def test_dashboard_redirects_to_the_slash(dashboard_server):
    with client(dashboard_server) as c:
        r = c.get("/dashboard")
        assert r.status_code in (301, 302, 307, 308)
        assert r.headers["location"].endswith("/dashboard/")


def test_pages_need_a_login_and_come_back_after_it(dashboard_server):
    with client(dashboard_server) as c:
        r = c.get("/dashboard/compare?runs=a")
        assert r.status_code == 303
        assert r.headers["location"] == "/dashboard/login?next=/dashboard/compare%3Fruns%3Da"
        assert "API key" in c.get(r.headers["location"]).text
        # Callbacks without the cookie get 401, not data.
        assert c.post("/dashboard/_dash-update-component", json={}).status_code == 401
        assert c.get("/dashboard/_dash-layout").status_code in (401, 303)


def test_a_malformed_callback_request_is_a_400_not_dashs_500(dashboard_server, runs_request):
    """Found by a fresh-user trial: Dash answered 500 to any body it could not read."""
    runs, output = runs_request["inputs"][0], runs_request["output"]
    n_inputs = len(runs_request["inputs"])
    cases = [
        (b"{", "the body is not JSON"),
        (b"[]", "a JSON object"),
        (b'{"output": "x", "inputs": []}', "outputs: Field required"),
        (b'{"output": "x", "outputs": [], "inputs": "zz"}', "inputs: Input should be a valid list"),
        (b'{"output": "a.b", "outputs": [], "inputs": []}', "no callback has the output 'a.b'"),
        (orjson.dumps({"output": output, "outputs": [], "inputs": [runs]}),
         f"the callback takes {n_inputs} inputs and states; 1 were sent"),
    ]  # fmt: skip
    with logged_in(dashboard_server, "read") as c:
        for body, says in cases:
            r = c.post("/dashboard/_dash-update-component", content=body)
            assert r.status_code == 400 and says in r.json()["detail"], (body, r.text)
        r = c.post("/dashboard/_dash-update-component", content=b"x" * (8 * 1024 * 1024 + 1))
        assert r.status_code == 413
        good = {**runs_request, "changedPropIds": []}
        r = c.post("/dashboard/_dash-update-component", json=good)
        assert r.status_code == 200 and "runs-body" in r.json()["response"]


def test_login_sets_a_strict_httponly_cookie(dashboard_server):
    with client(dashboard_server) as c:
        r = c.post(
            "/dashboard/login",
            data={"key": dashboard_server.keys["read"], "next": "/dashboard/runs/x"},
        )
        assert r.status_code == 303 and r.headers["location"] == "/dashboard/runs/x"
        cookie = r.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie
        assert "secure" not in cookie  # plain HTTP on loopback
        assert c.get("/dashboard/").status_code == 200
        assert c.get("/dashboard/runs/anything").status_code == 200  # Dash renders the page
    with client(dashboard_server) as c:
        r = c.post(
            "/dashboard/login",
            data={"key": dashboard_server.keys["read"]},
            headers={"x-forwarded-proto": "https"},
        )
        assert "secure" in r.headers["set-cookie"].lower()


def test_bad_keys_and_open_redirects_are_refused(dashboard_server):
    with client(dashboard_server) as c:
        r = c.post("/dashboard/login", data={"key": "vtg_nope", "next": "/dashboard/"})
        assert r.status_code == 401 and "Unknown or revoked" in r.text
        r = c.post(
            "/dashboard/login",
            data={"key": dashboard_server.keys["read"], "next": "//evil.example"},
        )
        assert r.headers["location"] == "/dashboard/"
        r = c.post(
            "/dashboard/login",
            data={"key": dashboard_server.keys["read"], "next": "https://evil.example/"},
        )
        assert r.headers["location"] == "/dashboard/"


def test_logout_forgets_the_key(dashboard_server):
    with logged_in(dashboard_server, "read") as c:
        assert c.get("/dashboard/").status_code == 200
        r = c.get("/dashboard/logout")
        assert r.status_code == 303
        assert c.get("/dashboard/").status_code == 303


def test_csv_downloads_use_the_login_cookie(dashboard_server):
    run_id = dashboard_server.runs["qwen-grpo"]
    with client(dashboard_server) as c:
        assert c.get(f"/dashboard/export/{run_id}/metrics.csv").status_code == 303
    with logged_in(dashboard_server, "read") as c:
        r = c.get(f"/dashboard/export/{run_id}/metrics.csv")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
        header = r.text.splitlines()[0].split(",")
        assert {"step", "acr", "acr_all_pass", "expected_acr"} <= set(header)
        assert len(r.text.splitlines()) >= 121
        # streamed in pieces, never built whole: no length is known when the answer starts
        assert "content-length" not in r.headers and r.headers["transfer-encoding"] == "chunked"
        r = c.get(f"/dashboard/export/{run_id}/prompts.csv?side=all_pass")
        assert r.status_code == 200
        assert r.text.startswith("prompt_id,groups,steps,collapsed,all_pass")
        assert c.get("/dashboard/export/no-such-run/metrics.csv").status_code == 404
        # the short id the pages show names the run here too (it was a 404)
        short = c.get(f"/dashboard/export/{run_id[:8]}/metrics.csv")
        assert short.status_code == 200, short.text
        assert short.text == c.get(f"/dashboard/export/{run_id}/metrics.csv").text
        assert run_id in short.headers["content-disposition"]
        assert c.get(f"/dashboard/export/{run_id[:8]}/prompts.csv").status_code == 200
        # as the API: a split filters (it was ignored), a bad side or split is a 422 (an empty
        # CSV), and another file name a 404 (the page's HTML, as 200): a trial
        with dashboard_server.api("read") as api:
            for split in ("train", "eval"):
                ours = c.get(f"/dashboard/export/{run_id}/metrics.csv?split={split}").text
                theirs = api.get(f"/api/v1/runs/{run_id}/export.csv?split={split}").text
                assert ours == theirs, split
        assert len(ours.splitlines()) == 1  # this run has no eval steps: the header only
        for bad in ("prompts.csv?side=bogus", "prompts.csv?split=..%2Fx", "metrics.csv?split=a b"):
            assert c.get(f"/dashboard/export/{run_id}/{bad}").status_code == 422, bad
        assert c.get(f"/dashboard/export/{run_id}/other.csv").status_code == 404


def test_a_crafted_send_of_a_malformed_command_is_said_not_a_500(dashboard_server):
    """The Send button's callback takes the command from a store in the browser: a crafted
    request with a store of another shape was a 500 with nothing in the log, and one without
    params said "Not sent: 'params'" (a trial). Each is said, and nothing is sent."""
    with dashboard_server.api("ingest") as api:
        run = api.post("/api/v1/runs", json={"name": "crafted"}).json()
    with logged_in(dashboard_server, "control") as c:
        deps = c.get("/dashboard/_dash-dependencies").json()
        (send,) = [d for d in deps if any(i["id"] == "cmd-confirm-send" for i in d["inputs"])]
        outputs = []
        for part in send["output"].strip(".").split("..."):
            oid, prop = part.rsplit(".", 1)
            outputs.append({"id": oid, "property": prop.split("@")[0]})
        stop = {"type": "stop", "params": {}}
        for pending, reason, says in (
            ("str", None, "not a command"),
            ({"type": "bogus"}, None, "no type or parameters"),
            ({**stop, "alert_id": [1]}, None, "not an alert id"),
            # another run's alert, or none: the log linked a command to it (a trial)
            ({**stop, "alert_id": 99_999}, None, "alert 99999 is not an alert of this run"),
            ({"type": "bogus", "params": {}}, None, "type: Input should be"),  # one line
            # pydantic's dump with a link said so (a trial); the box holds 1,000 since
            (stop, "r" * 1001, "the reason has 1,001 characters; at most 1,000"),
        ):
            body = {
                "output": send["output"],
                "outputs": outputs,
                "inputs": [{"id": "cmd-confirm-send", "property": "n_clicks", "value": 1}],
                "state": [
                    {"id": "run-pending-command", "property": "data", "value": pending},
                    {"id": "run-id", "property": "data", "value": run["run_id"]},
                    {"id": "cmd-reason", "property": "value", "value": reason},
                ],
                "changedPropIds": ["cmd-confirm-send.n_clicks"],
            }
            r = c.post("/dashboard/_dash-update-component", json=body)
            assert r.status_code == 200, (pending, r.text)
            assert "Not sent" in r.text and says in r.text, (pending, r.text)
    with dashboard_server.api("control") as api:
        assert api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"] == []


def _crafted_call(c, deps: list, output_part: str, values: dict) -> object:  # noqa: ANN001
    """POST the callback whose output names ``output_part`` with ``values`` ({"id.prop": v})
    for its inputs and states (None for the others), as a hand-built request would."""
    (dep,) = [d for d in deps if output_part in d["output"]]
    outputs = []
    for part in dep["output"].strip(".").split("..."):
        oid, prop = part.rsplit(".", 1)
        outputs.append({"id": oid, "property": prop.split("@")[0]})

    def given(items: list) -> list:
        return [{**i, "value": values.get(f"{i['id']}.{i['property']}")} for i in items]

    body = {
        "output": dep["output"],
        "outputs": outputs if len(outputs) > 1 else outputs[0],
        "inputs": given(dep["inputs"]),
        "state": given(dep.get("state", [])),
        "changedPropIds": list(values)[:1],
    }
    return c.post("/dashboard/_dash-update-component", json=body)


def test_crafted_values_for_the_runs_and_compare_callbacks_are_no_500(dashboard_server):
    """A list for a dropdown's value, text for a click count, objects or a number for run ids
    (and, for the prompts tab, a list or a number for its side or split): each was a 500 with
    a traceback (trials); they count as nothing chosen."""
    with logged_in(dashboard_server, "read") as c:
        deps = c.get("/dashboard/_dash-dependencies").json()
        for values in (
            {"runs-project.value": ["demo", "other"]},
            {"runs-more.n_clicks": "x"},
            {"runs-status.value": {"a": 1}, "runs-order.value": 5},
        ):
            r = _crafted_call(c, deps, "runs-body.children", values)
            assert r.status_code == 200, (values, r.text[:300])
        for runs in ([{"x": 1}], 5, [None], "abc"):
            r = _crafted_call(c, deps, "compare-graph.figure", {"compare-runs.value": runs})
            assert r.status_code == 200, (runs, r.text[:300])
        # the prompts tab's dropdowns: a list, an object or a number was bound into its query
        run_id = next(iter(dashboard_server.runs.values()))
        for side, split in ((["a"], "train"), ({"a": 1}, ["x"]), (None, 1e30), ("all_pass", {})):
            values = {"run-tabs.value": "prompts", "prompts-side.value": side,
                      "prompts-split.value": split, "run-id.data": run_id}  # fmt: skip
            r = _crafted_call(c, deps, "prompts-body.children", values)
            assert r.status_code == 200, (side, split, r.text[:300])


def test_values_a_browser_sends_as_text_and_browser_side_callbacks_are_400s(dashboard_server):
    """A number, a list or null for the run page's run id, an address outside the dashboard
    for Dash Pages' router, and a call of a callback that runs in the browser were 500s with a
    traceback (a trial): each is a 400 saying what is wrong; the real values still work."""
    run_id = next(iter(dashboard_server.runs.values()))
    with logged_in(dashboard_server, "read") as c:
        deps = c.get("/dashboard/_dash-dependencies").json()
        for value in (None, 5, [], {"a": 1}):
            r = _crafted_call(c, deps, "cmd-log.children", {"run-id.data": value})
            assert r.status_code == 400, (value, r.text[:300])
            assert f"run-id.data must be text, not {type(value).__name__}" in r.text, r.text
        assert _crafted_call(c, deps, "cmd-log.children", {"run-id.data": run_id}).is_success
        page = "_pages_content.children"
        for path, says in ((None, "must be text"), ("/elsewhere", "an address under /dashboard/")):
            r = _crafted_call(c, deps, page, {"_pages_location.pathname": path})
            assert r.status_code == 400 and says in r.text, (path, r.text[:300])
        r = _crafted_call(c, deps, page, {"_pages_location.pathname": f"/dashboard/runs/{run_id}"})
        assert r.status_code == 200 and "run-id" in r.text, r.text[:300]
        r = _crafted_call(c, deps, "runs-address.data", {"runs-project.value": "x"})
        assert r.status_code == 400 and "is computed in the browser" in r.text, r.text[:300]


def test_a_callback_that_fails_is_logged_with_its_traceback(dashboard_server):
    """Dash answered a failing callback with a 500 and logged nothing (a trial): the server
    log names the callback's trigger and holds the traceback. The failure: the groups the
    prompts tab reads are unreadable (cut short for the request, then restored)."""
    database = sqlite3.connect(dashboard_server.db_url.removeprefix("sqlite:///"))
    run_id = next(iter(dashboard_server.runs.values()))
    with logged_in(dashboard_server, "read") as c, _corrupted(database):
        deps = c.get("/dashboard/_dash-dependencies").json()
        (prompts,) = [d for d in deps if d["output"].startswith("..prompts-body.children")]
        outputs = []
        for part in prompts["output"].strip(".").split("..."):
            oid, prop = part.rsplit(".", 1)
            outputs.append({"id": oid, "property": prop})
        values = {"run-tabs": "prompts", "prompts-side": None, "prompts-split": None}
        body = {
            "output": prompts["output"],
            "outputs": outputs,
            "inputs": [
                {"id": i["id"], "property": i["property"], "value": values[i["id"]]}
                for i in prompts["inputs"]
            ],  # fmt: skip
            "state": [{"id": "run-id", "property": "data", "value": run_id}],
            "changedPropIds": ["run-tabs.value"],
        }
        r = c.post("/dashboard/_dash-update-component", json=body)
    assert r.status_code == 500, r.text
    logged = dashboard_server.log_path.read_text()
    assert "dashboard callback failed (triggered by run-tabs)" in logged, logged[-2000:]
    assert "Traceback (most recent call last)" in logged


@contextmanager
def _corrupted(database: sqlite3.Connection):
    """Every stored block of groups cut to one byte while the block runs (data the server
    cannot read: a fault of the database's content), then restored."""
    kept = database.execute("SELECT rowid, data FROM group_blocks").fetchall()
    database.execute("UPDATE group_blocks SET data = x'00'")
    database.commit()
    try:
        yield
    finally:
        database.executemany("UPDATE group_blocks SET data = ? WHERE rowid = ?",
                             [(data, rowid) for rowid, data in kept])  # fmt: skip
        database.commit()
        database.close()
