"""Delivery and scale-out (docs/design.md §6): webhooks that survive a receiver outage and a server
restart, the periodic pass (incomplete steps, `stale`), and two server processes on one
PostgreSQL database that never double-fire an alert, a webhook or a command."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers.alerts import Receiver, alerts_of, make_rule
from tests.helpers.api import new_run, post_steps
from tests.helpers.cli import create_key, run_cli
from tests.helpers.polling import wait_until
from tests.helpers.postgres import new_postgres_database
from tests.helpers.server import free_port, start_server

ALL_FAIL = [[0, 0, 0, 0]] * 4
LIVE = [[0, 1, 0, 1]] * 4


def serve(database_url: str, log_dir, env: dict | None = None):  # noqa: ANN001, ANN201
    srv = start_server(database_url, log_dir, env=env)
    srv.keys["all"] = KEYS[database_url]
    return srv


KEYS: dict[str, str] = {}


def prepare(database_url: str) -> None:
    run_cli("db", "upgrade", "--database-url", database_url)
    KEYS[database_url] = create_key(database_url, "ingest,read,control,admin", "all")


FAST = {
    "VANTAGE_PERIODIC_PASS_S": "0.3",
    "VANTAGE_STEP_COMPLETE_AFTER_S": "1.5",
    "VANTAGE_PUBLIC_URL": "https://vantage.example.com/",
    "VANTAGE_COMMAND_TTL_S": "2",
    "VANTAGE_WEBHOOK_GIVE_UP_S": "2",
    "VANTAGE_WEBHOOK_TIMEOUT_S": "3",
    "VANTAGE_WEBHOOK_SECRET": "test-signing-secret-0123",
}


@pytest.fixture(scope="module")
def fast_server(tmp_path_factory):  # noqa: ANN001, ANN201
    """A server whose periodic pass runs every 0.3 s, completes steps after 1.5 s, and expires
    commands after 2 s."""
    url = f"sqlite:///{tmp_path_factory.mktemp('fastdb') / 'v.db'}"
    prepare(url)
    srv = serve(url, tmp_path_factory.mktemp("fastlogs"), env=FAST)
    yield srv
    srv.stop()


def test_webhook_survives_receiver_outage_and_server_restart(tmp_path):
    """The receiver is down for 30 s while an alert fires and resolves, and the server restarts
    in between: once the receiver is back it gets each message exactly once, in order."""
    url = f"sqlite:///{tmp_path / 'v.db'}"
    prepare(url)
    port = free_port()
    srv = serve(url, tmp_path)
    t0 = time.monotonic()
    with srv.client("all") as api:
        run = new_run(api, name="outage")
        make_rule(
            api,
            name="outage",
            run_id=run["run_id"],
            metric="acr",
            op=">=",
            threshold=0.9,
            notify=[f"http://127.0.0.1:{port}/hook"],
        )
        post_steps(api, run, [{"step": 1, "groups": ALL_FAIL}])
        post_steps(api, run, [{"step": 2, "groups": LIVE}])
        assert [a["state"] for a in alerts_of(api, run["run_id"], "outage")] == ["resolved"]
    time.sleep(8)  # a few failed attempts
    stop_started = time.monotonic()
    srv.stop()
    assert time.monotonic() - stop_started < 10  # SIGTERM stops the server within 10 s
    srv = serve(url, tmp_path)
    try:
        time.sleep(max(0.0, 30 - (time.monotonic() - t0)))
        receiver = Receiver(port)
        try:
            messages = receiver.wait_for(2, timeout=20)
            time.sleep(2)
            assert [(m["state"], m["step"]) for m in receiver.messages] == [
                ("firing", 1),
                ("resolved", 2),
            ]
            assert messages[0]["run_name"] == "outage"
        finally:
            receiver.close()
    finally:
        srv.stop()


@pytest.mark.parametrize("refusal", [500, 404])
def test_a_message_that_keeps_failing_does_not_hold_back_the_next(fast_server, refusal):
    """Messages to a URL go in order; the firing one is refused (a 500 until the give-up time,
    2 s here; a 404 at once), and the resolved one behind it still arrives."""
    receiver = Receiver(status_for=lambda body: refusal if body["state"] == "firing" else 200)
    try:
        with fast_server.client("all") as api:
            run = new_run(api, name=f"refused-{refusal}")
            secret = f"{receiver.url}/T0/s3cr3t-{refusal}"  # a Slack URL's token
            make_rule(api, name=f"refused-{refusal}", run_id=run["run_id"], metric="acr",
                      op=">=", threshold=0.9, notify=[secret])  # fmt: skip
            post_steps(api, run, [{"step": 1, "groups": ALL_FAIL}])
            post_steps(api, run, [{"step": 2, "groups": LIVE}])
        assert wait_until(lambda: any(m["state"] == "resolved" for m in receiver.messages), 15)
        firing = [m for m in receiver.messages if m["state"] == "firing"]
        assert len(firing) == 1 if refusal == 404 else len(firing) >= 2, receiver.messages
        assert receiver.messages[-1]["state"] == "resolved"
        # every try of one message carries its outbox id, so a receiver can drop copies
        ids = [(m["state"], h["x-vantage-message-id"]) for (h, _), m in
               zip(receiver.raw, receiver.messages, strict=True)]  # fmt: skip
        assert len({i for state, i in ids if state == "firing"}) == 1, ids
        assert len(set(dict(ids).values())) == 2, ids
        # the server log names the failing target by host, not by its secret (a trial)
        logged = fast_server.log_path.read_text()
        shown = f"webhook http://127.0.0.1:{receiver.port}/… (firing message of alert "
        assert shown in logged and f"rule 'refused-{refusal}', run " in logged
        assert "failed (attempt 1)" in logged
        assert "s3cr3t" not in logged
    finally:
        receiver.close()


def fire(api, name: str, url: str) -> None:
    """A run whose rule notifies ``url`` fires at once."""
    run = new_run(api, name=name)
    make_rule(api, name=name, run_id=run["run_id"], metric="acr", op=">=", threshold=0.9,
              notify=[url])  # fmt: skip
    post_steps(api, run, [{"step": 1, "groups": ALL_FAIL}])


def test_a_slow_target_gets_one_copy_and_holds_up_no_other(fast_server):
    """A target slower than the webhook timeout (3 s here) got the same message again at each
    retry (six copies in a minute: a trial): it gets one. Meanwhile a ready target's message
    goes out at once (it waited for the slow send's timeout). A redirect is given up at once."""
    slow, ready, moved = Receiver(delay=5.0), Receiver(), Receiver(status=307)
    try:
        with fast_server.client("all") as api:
            fire(api, "slow-target", slow.url)
            assert slow.wait_for(1, timeout=10)
            fired = time.monotonic()
            fire(api, "ready-target", ready.url)
            assert ready.wait_for(1, timeout=10)
            assert ready.times[0] - fired < 2.0  # docs/design.md §6: within 2 s of the transition
            fire(api, "moved-target", moved.url)
            assert moved.wait_for(1, timeout=10)
        time.sleep(7)  # past the timeout, a retry's backoff and the give-up time (2 s)
        assert len(slow.messages) == 1 and len(moved.messages) == 1
        logged = fast_server.log_path.read_text()
        assert "'slow-target'" in logged and "no answer within 3 s" in logged
        assert "a redirect to https://elsewhere.example/…, not followed" in logged
    finally:
        for receiver in (slow, ready, moved):
            receiver.close()


def test_incomplete_step_is_evaluated_by_the_periodic_pass(fast_server):
    """Rank 1 never reports step 1 of a two-rank run: the step is evaluated after
    `step_complete_after_s` (1.5 s here) from rank 0's groups alone."""
    with fast_server.client("all") as api:
        run = new_run(api, world_size=2)
        make_rule(api, name="late", run_id=run["run_id"], metric="acr", op=">=", threshold=0.9)
        post_steps(api, run, [{"step": 1, "rank": 0, "world_size": 2, "groups": ALL_FAIL}])
        assert alerts_of(api, run["run_id"], "late") == []
        assert wait_until(lambda: alerts_of(api, run["run_id"], "late"), timeout=10)
        (ep,) = alerts_of(api, run["run_id"], "late")
        assert (ep["state"], ep["fired_step"]) == ("firing", 1)


@pytest.mark.parametrize("end", ["expires", "is deleted"])
def test_an_alert_still_firing_when_its_silence_ends_is_told(fast_server, end):
    """An alert that fired under a silence and still fired when the silence ended was never
    told: chat heard nothing of an incident that was still going on (a trial). The periodic
    pass tells it once, as firing; its resolution follows."""
    receiver = Receiver()
    try:
        with fast_server.client("all") as api:
            run = new_run(api)
            until = datetime.now(UTC) + timedelta(seconds=2 if end == "expires" else 3600)
            r = api.post("/api/v1/silences", json={
                "matchers": {"run_id": run["run_id"]}, "until": until.isoformat()})  # fmt: skip
            assert r.status_code == 201, r.text
            make_rule(api, name=f"unmuted-{end}", run_id=run["run_id"], metric="acr", op=">=",
                      threshold=0.9, notify=[receiver.url])  # fmt: skip
            post_steps(api, run, [{"step": 0, "groups": ALL_FAIL}])
            (alert,) = alerts_of(api, run["run_id"], f"unmuted-{end}")
            assert alert["state"] == "firing"
            time.sleep(1.0)
            assert receiver.messages == []  # muted while the silence lasts
            if end == "is deleted":
                assert api.delete(f"/api/v1/silences/{r.json()['id']}").status_code == 204
            [told] = receiver.wait_for(1, timeout=10)
            assert (told["state"], told["step"], told["alert_id"]) == (
                "firing", 0, alert["alert_id"])  # fmt: skip
            time.sleep(1.0)
            assert len(receiver.messages) == 1  # once, not at every pass
            post_steps(api, run, [{"step": 1, "groups": LIVE}])
            assert [m["state"] for m in receiver.wait_for(2)] == ["firing", "resolved"]
    finally:
        receiver.close()


def test_stale_fires_and_resolves_when_data_arrives(fast_server):
    receiver = Receiver()
    try:
        with fast_server.client("all") as api:
            run = new_run(api, name="quiet", heartbeat_s=0.5)
            make_rule(
                api,
                name="stale-here",
                run_id=run["run_id"],
                metric="stale",
                op=">",
                threshold=3,
                notify=[receiver.url],
            )
            post_steps(api, run, [{"step": 7, "groups": LIVE}])
            assert wait_until(
                lambda: (
                    [a["state"] for a in alerts_of(api, run["run_id"], "stale-here")] == ["firing"]
                ),
                timeout=10,
            )
            assert alerts_of(api, run["run_id"], "stale-here")[0]["fired_step"] == 7
            assert api.get(f"/api/v1/runs/{run['run_id']}").json()["status"] == "stale"
            post_steps(api, run, [{"step": 8, "groups": LIVE}])
            (ep,) = alerts_of(api, run["run_id"], "stale-here")
            assert ep["state"] == "resolved"
            messages = receiver.wait_for(2)
            assert [m["state"] for m in messages] == ["firing", "resolved"]
            url = f"https://vantage.example.com/dashboard/runs/{run['run_id']}"
            assert messages[0]["dashboard_url"] == url and url in messages[0]["text"]
    finally:
        receiver.close()


def test_names_in_the_slack_text_cannot_ping_or_link(fast_server):
    """A run named `<!channel> & <http://evil.example|click me>` pinged the channel and showed a
    disguised link in Slack (a trial): `text` escapes &, < and >; the other fields keep names."""
    receiver = Receiver()
    try:
        with fast_server.client("all") as api:
            name = (
                "<!channel> & <http://evil.example|click me> next line"  # no line breaks: refused
            )
            run = new_run(api, name=name)
            make_rule(api, name="r<b>", run_id=run["run_id"], metric="acr", op=">",
                      threshold=0.5, notify=[receiver.url])  # fmt: skip
            post_steps(api, run, [{"step": 1, "groups": [[1, 1]]}])
            (message,) = receiver.wait_for(1)
        assert "<!channel>" not in message["text"] and "<http://evil" not in message["text"]
        said = "&lt;!channel&gt; &amp; &lt;http://evil.example|click me&gt; next line"
        assert said in message["text"] and "\n" not in message["text"], message["text"]
        assert "r&lt;b&gt;" in message["text"]
        assert message["run_name"] == name and message["rule"] == "r<b>"
    finally:
        receiver.close()


def test_messages_are_signed_with_the_webhook_secret(fast_server):
    """A receiver could not tell Vantage's messages from anyone's who knew its URL (a trial):
    with VANTAGE_WEBHOOK_SECRET each carries X-Vantage-Signature, t=<unix time>,v1=<HMAC-SHA256
    of "<t>." + the raw body>, which a receiver recomputes."""
    import hashlib
    import hmac

    receiver = Receiver()
    try:
        with fast_server.client("all") as api:
            run = new_run(api, name="signed")
            make_rule(api, name="signed", run_id=run["run_id"], metric="acr", op=">",
                      threshold=0.5, notify=[receiver.url])  # fmt: skip
            post_steps(api, run, [{"step": 1, "groups": [[1, 1]]}])
            receiver.wait_for(1)
        (headers, body), secret = receiver.raw[0], FAST["VANTAGE_WEBHOOK_SECRET"].encode()
        fields = dict(part.split("=", 1) for part in headers["x-vantage-signature"].split(","))
        assert abs(int(fields["t"]) - time.time()) < 60
        mac = hmac.new(secret, fields["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(fields["v1"], mac)
        assert headers["content-type"] == "application/json" and b"signed" in body
        forged = hmac.new(b"another-secret-0123", fields["t"].encode() + b"." + body,
                          hashlib.sha256).hexdigest()  # fmt: skip
        assert fields["v1"] != forged
    finally:
        receiver.close()


@pytest.mark.postgres
def test_two_replicas_never_double_fire(tmp_path):
    """Two `vantage serve` processes on one PostgreSQL database; rank 0 posts to one and rank 1
    to the other, in parallel. Four collapse bursts: exactly four episodes, eight webhooks (one
    firing and one resolved each) and four commands."""
    try:
        database_url, drop = new_postgres_database()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"PostgreSQL not reachable: {exc}")
    receiver = Receiver()
    servers = []
    try:
        prepare(database_url)
        servers = [serve(database_url, tmp_path), serve(database_url, tmp_path)]
        with servers[0].client("all") as api:
            run = new_run(api, name="replicas", world_size=2)
            make_rule(
                api,
                name="burst",
                run_id=run["run_id"],
                metric="acr",
                op=">=",
                threshold=0.9,
                notify=[receiver.url],
                # a checkpoint per episode (a set_mitigation already asked for is not repeated)
                mitigation={"type": "checkpoint", "params": {}},
            )
        collapsed = {s: ((s - 1) // 2) % 2 == 0 for s in range(1, 17)}
        errors: list[str] = []

        def rank(r: int) -> None:
            with servers[r].client("all") as c:
                for s in range(1, 17):
                    groups = [[0, 0], [1, 1]] if collapsed[s] else [[0, 1], [1, 0]]
                    resp = c.post(
                        f"/api/v1/runs/{run['run_id']}/steps",
                        json={
                            "attempt": 1,
                            "records": [{"step": s, "rank": r, "world_size": 2, "groups": groups}],
                        },
                    )
                    if resp.status_code != 200:
                        errors.append(resp.text)

        threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        with servers[1].client("all") as api:
            episodes = alerts_of(api, run["run_id"], "burst")
            assert sorted((e["fired_step"], e["resolved_step"]) for e in episodes) == [
                (1, 3),
                (5, 7),
                (9, 11),
                (13, 15),
            ]
            commands = api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"]
            assert len(commands) == 4
            assert {c["alert_id"] for c in commands} == {e["alert_id"] for e in episodes}
        receiver.wait_for(8, timeout=20)
        time.sleep(2)
        sent = sorted((m["step"], m["state"]) for m in receiver.messages)
        assert sent == sorted(
            [(s, "firing") for s in (1, 5, 9, 13)] + [(s, "resolved") for s in (3, 7, 11, 15)]
        )
    finally:
        for s in servers:
            s.stop()
        receiver.close()
        drop()


def test_alert_command_is_redelivered_until_its_ttl_then_expires(fast_server):
    with fast_server.client("all") as api:
        run = new_run(api)
        make_rule(
            api,
            name="ttl",
            run_id=run["run_id"],
            metric="acr",
            op=">=",
            threshold=0.9,
            mitigation={"type": "set_mitigation", "params": {"mode": "aapo"}},
        )
        fired = post_steps(api, run, [{"step": 1, "groups": ALL_FAIL}])["commands"]
        assert [c["params"]["mode"] for c in fired] == ["aapo"]
        again = post_steps(api, run, [{"step": 2, "groups": ALL_FAIL}])["commands"]
        assert [c["command_id"] for c in again] == [fired[0]["command_id"]]
        time.sleep(2.5)
        assert post_steps(api, run, [{"step": 3, "groups": ALL_FAIL}])["commands"] == []
        log = api.get(f"/api/v1/runs/{run['run_id']}/commands").json()["commands"]
        assert [(c["status"], c["issued_by"]) for c in log] == [("expired", "alert:ttl")]


def test_slack_and_discord_targets_get_their_own_format(fast_server):
    """docs/design.md §6: a Slack target gets `{text, blocks}`, a Discord one `{content,
    embeds}`, another URL the JSON body; each its firing and then its resolved message, signed.
    A receiver on 127.0.0.1 has no Slack or Discord host name: the `slack+` and `discord+`
    prefixes name the format."""
    slack, discord, plain = Receiver(), Receiver(), Receiver()
    try:
        with fast_server.client("all") as api:
            run = new_run(api, name="formats")
            targets = [f"slack+{slack.url}", f"discord+{discord.url}", plain.url]
            rule = make_rule(api, name="formats", run_id=run["run_id"], metric="acr", op=">=",
                             threshold=0.9, severity="critical", notify=targets,
                             description="Turn on AVSPO.")  # fmt: skip
            assert rule["notify"] == targets
            post_steps(api, run, [{"step": 1, "groups": ALL_FAIL}])
            post_steps(api, run, [{"step": 2, "groups": LIVE}])
            for receiver in (slack, discord, plain):
                assert len(receiver.wait_for(2)) == 2
        firing, resolved = slack.messages
        assert firing.keys() == {"text", "blocks"} and "formats FIRING" in firing["text"]
        assert firing["blocks"][0]["text"]["text"] == "formats FIRING"
        said = [block["text"]["text"] for block in firing["blocks"] if "text" in block]
        assert "*Recommended action*\nTurn on AVSPO." in said
        assert "formats RESOLVED" in resolved["text"] and "at step 2" in resolved["text"]
        firing, resolved = discord.messages
        assert firing.keys() == {"content", "embeds", "allowed_mentions"}
        (embed,) = firing["embeds"]
        assert embed["title"] == "formats FIRING" and embed["color"] == 0xD93025
        assert embed["url"] == f"https://vantage.example.com/dashboard/runs/{run['run_id']}"
        fields = {f["name"]: f["value"] for f in embed["fields"]}
        assert fields["Step"] == "1" and fields["Recommended action"] == "Turn on AVSPO."
        assert resolved["embeds"][0]["title"] == "formats RESOLVED"
        assert [(m["state"], m["step"]) for m in plain.messages] == [("firing", 1), ("resolved", 2)]
        assert plain.messages[0]["recommended_action"] == "Turn on AVSPO."
        for receiver in (slack, discord, plain):
            assert all("x-vantage-signature" in headers for headers, _ in receiver.raw)
    finally:
        for receiver in (slack, discord, plain):
            receiver.close()


def test_an_e_mail_target_needs_the_smtp_settings(fast_server):
    with fast_server.client("all") as api:
        rule = {"name": "mail", "metric": "acr", "op": ">", "threshold": 0.5}
        r = api.post("/api/v1/alert-rules", json={**rule, "notify": ["ops@example.com"]})
        assert r.status_code == 422
        assert "VANTAGE_SMTP_HOST and VANTAGE_SMTP_FROM" in r.text, r.text


class Inbox:
    """An aiosmtpd handler that keeps every message it is given."""

    def __init__(self) -> None:
        self.messages: list = []

    async def handle_DATA(self, server, session, envelope):  # noqa: ANN001, ANN201, N802
        from email import message_from_bytes, policy

        message = message_from_bytes(envelope.content, policy=policy.default)
        self.messages.append((envelope.mail_from, envelope.rcpt_tos, message, session.ssl))
        return "250 OK"


def self_signed_certificate(folder) -> tuple[str, str]:  # noqa: ANN001
    """A certificate for 127.0.0.1 and its key, as PEM files in ``folder``."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)  # noqa: E501
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = folder / "smtp-cert.pem", folder / "smtp-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )  # fmt: skip
    )
    return str(cert_file), str(key_file)


@pytest.mark.parametrize("starttls", [False, True], ids=["plain", "starttls-login"])
def test_e_mail_targets_get_each_message_in_order(tmp_path, starttls):
    """A real SMTP server (aiosmtpd) on 127.0.0.1: the firing and the resolved message arrive
    in that order, from VANTAGE_SMTP_FROM to the rule's address, with the JSON body attached
    and signed. With STARTTLS (a self-signed certificate the server trusts through
    SSL_CERT_FILE) the server logs in, and the mail server refuses any message sent before
    STARTTLS or the login."""
    controller_module = pytest.importorskip("aiosmtpd.controller")
    import ssl

    from aiosmtpd.smtp import AuthResult

    inbox, port, env = Inbox(), free_port(), {**FAST}
    options: dict = {}
    if starttls:
        cert, key = self_signed_certificate(tmp_path)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)

        def login(server, session, envelope, mechanism, auth_data):  # noqa: ANN001, ANN202
            return AuthResult(success=(auth_data.login, auth_data.password) == (b"vantage", b"pw"))

        options = {"tls_context": context, "require_starttls": True, "authenticator": login,
                   "auth_required": True}  # fmt: skip
        env |= {"SSL_CERT_FILE": cert, "VANTAGE_SMTP_USER": "vantage",
                "VANTAGE_SMTP_PASSWORD": "pw"}  # fmt: skip
    controller = controller_module.Controller(inbox, hostname="127.0.0.1", port=port, **options)
    controller.start()
    env |= {"VANTAGE_SMTP_HOST": "127.0.0.1", "VANTAGE_SMTP_PORT": str(port),
            "VANTAGE_SMTP_FROM": "Vantage <vantage@example.com>",
            "VANTAGE_SMTP_STARTTLS": str(starttls).lower()}  # fmt: skip
    url = f"sqlite:///{tmp_path / 'v.db'}"
    prepare(url)
    srv = serve(url, tmp_path, env=env)
    try:
        with srv.client("all") as api:
            run = new_run(api, name="mailed")
            rule = make_rule(api, name="mailed", run_id=run["run_id"], metric="acr", op=">=",
                             threshold=0.9, notify=["OPS@Example.com"],
                             description="Lower the learning rate.")  # fmt: skip
            assert rule["notify"] == ["mailto:OPS@Example.com"]  # an address, as given
            post_steps(api, run, [{"step": 1, "groups": ALL_FAIL}])
            post_steps(api, run, [{"step": 2, "groups": LIVE}])
            assert wait_until(lambda: len(inbox.messages) >= 2, timeout=15), (
                srv.log_path.read_text()
            )
        time.sleep(1.5)  # nothing more comes
        assert len(inbox.messages) == 2
        (sender, to, firing, tls), (_, _, resolved, _) = inbox.messages
        assert sender == "vantage@example.com" and to == ["OPS@Example.com"]
        assert bool(tls) == starttls
        # past 78 characters the header is folded: this parser keeps the fold's blank
        assert (
            firing["Subject"].lstrip()
            == "[warning] mailed FIRING on run 'mailed' at step 1: acr = 1 (at or above 0.9)"
        )
        assert resolved["Subject"].startswith("[warning] mailed RESOLVED on run 'mailed' at step 2")
        text = firing.get_body(("plain",)).get_content().replace("\r\n", "\n")  # as on the wire
        assert "Recommended action:\nLower the learning rate." in text
        (attached,) = firing.iter_attachments()
        data = attached.get_content()
        assert json.loads(data)["state"] == "firing" and json.loads(data)["step"] == 1
        fields = dict(part.split("=", 1) for part in firing["X-Vantage-Signature"].split(","))
        secret = FAST["VANTAGE_WEBHOOK_SECRET"].encode()
        mac = hmac.new(secret, fields["t"].encode() + b"." + data, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(fields["v1"], mac)
    finally:
        srv.stop()
        controller.stop()
