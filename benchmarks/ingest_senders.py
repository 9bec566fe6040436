"""The senders of benchmarks/ingest.py: one client per sending thread, for Vantage and for
MLflow, placed on the server's workers the same way for both servers."""

from __future__ import annotations

import http.client
import threading
import time
import uuid

import httpx
import numpy as np
import orjson
import psutil


class Sender:
    """Sends batches from one or more senders, each with a client of its own; steps and
    timestamps come from shared counters, so concurrent senders never repeat a step unless a
    round gives each batch its step and rank (``--lockstep``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.step = 0
        self.latencies: list[float] = []

    def next_step(self) -> int:
        with self._lock:
            self.step += 1
            return self.step

    def reserve_steps(self, n: int) -> int:
        """The first of ``n`` fresh steps."""
        with self._lock:
            first, self.step = self.step + 1, self.step + n
            return first

    def prepare(self, senders: int) -> None:
        """Make the clients of ``senders`` senders before a round's clock starts."""

    def send(
        self, groups: list[list[float]], sender: int = 0, step: int | None = None, ranks: int = 1
    ) -> int:
        """Send one batch from ``sender``; returns the number of groups stored. With ``step``
        given, the sender sends it as rank ``sender`` of ``ranks``."""
        raise NotImplementedError


def server_worker(conn: http.client.HTTPConnection, port: int) -> int:
    """The process id of the server worker holding ``conn``'s connection (this machine)."""
    client_port = conn.sock.getsockname()[1]
    for c in psutil.net_connections("tcp"):
        if c.laddr and c.laddr.port == port and c.raddr and c.raddr.port == client_port:
            return c.pid
    raise RuntimeError(f"no server process holds the connection from port {client_port}")


class Answer:
    """An HTTP answer read whole: its status and body."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status_code, self.content = status, body

    def json(self) -> object:
        return orjson.loads(self.content)


def request(
    conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None
) -> Answer:
    """One request over ``conn``, kept alive; raises for a status of 400 or more."""
    headers = {"content-type": "application/json"} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    answer = Answer(r.status, r.read())
    if r.status >= 400:
        raise RuntimeError(f"{method} {path}: {r.status} {answer.content[:500]!r}")
    return answer


class PlacedSender(Sender):
    """Senders with kept-alive connections spread over the server's workers. With several
    workers a connection stays with the worker that accepted it, and two senders' connections
    land on one worker about half the time; that worker then runs both while the other idles.
    Many ranks spread evenly, as a load balancer would spread two; here each sender reconnects
    until its worker is one the others use least. Both servers' senders are placed the same way,
    and placed again before each round when the server closed a connection meanwhile (uvicorn
    closes a connection idle for 5 s, as one server's are while the other's rounds run).

    The connections are the standard library's ``http.client``: the client process shares the
    machine's cores with the server under test, and httpx costs more than twice the CPU per
    request, a cost a training job pays on the trainer's machine, not the server's."""

    health = "/health"

    def __init__(self, url: str, workers: int = 1):
        super().__init__()
        self.url, self.workers = url, workers
        self.port = int(url.rsplit(":", 1)[1])
        self.clients: list[http.client.HTTPConnection] = []
        self.placement: list[int] = []  # the worker of each client
        self.replaced = 0  # connections placed again (`prepare`)

    def client(self, sender: int) -> http.client.HTTPConnection:
        while len(self.clients) <= sender:
            client, worker = self._spread_client(self.placement)
            self.clients.append(client)
            self.placement.append(worker)
        return self.clients[sender]

    def _spread_client(self, others: list[int]) -> tuple[http.client.HTTPConnection, int]:
        """A connection on a worker that ``others`` (the workers of the other senders) use
        least, and that worker."""
        fair = -(-(len(others) + 1) // self.workers)  # ceil: senders per worker
        for _ in range(100):
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            request(conn, "GET", self.health)
            worker = server_worker(conn, self.port)
            if others.count(worker) < fair:
                return conn, worker
            conn.close()
        raise RuntimeError(f"could not place a connection on a free worker of {self.url}")

    def prepare(self, senders: int) -> None:
        for i in range(senders):
            try:
                request(self.client(i), "GET", self.health)
                continue
            except (http.client.HTTPException, OSError):  # the server closed it
                self.clients[i].close()
            others = self.placement[:i] + self.placement[i + 1 :]
            self.clients[i], self.placement[i] = self._spread_client(others)
            self.replaced += 1

    def post(self, sender: int, path: str, body: dict) -> Answer:
        t0 = time.perf_counter()
        answer = request(self.client(sender), "POST", path, orjson.dumps(body))
        self.latencies.append(time.perf_counter() - t0)
        return answer


class VantageSender(PlacedSender):
    """``POST /api/v1/runs/{id}/steps``: one record of the batch's groups (raw rewards)."""

    health = "/healthz"

    def __init__(self, url: str, group_size: int, workers: int = 1):
        super().__init__(url, workers)
        with httpx.Client(base_url=url, timeout=60) as client:
            body = {"name": "bench", "group_size": group_size}
            run = client.post("/api/v1/runs", json=body).json()
        self.run_id, self.attempt = run["run_id"], run["attempt"]

    def send(
        self, groups: list[list[float]], sender: int = 0, step: int | None = None, ranks: int = 1
    ) -> int:
        record = {"step": self.next_step() if step is None else step, "groups": groups}
        if step is not None:
            record |= {"rank": sender, "world_size": ranks}
        body = {"attempt": self.attempt, "records": [record]}
        accepted = self.post(sender, f"/api/v1/runs/{self.run_id}/steps", body).json()["accepted"]
        assert accepted == len(groups), accepted
        return accepted


class MlflowSender(PlacedSender):
    """MLflow's ``log_batch`` REST call (``runs/log-batch``, what `MlflowClient.log_batch`
    sends) with two metric points per group, computed with numpy; over the same kind of
    placed connection as Vantage's, so that neither client's own overhead nor the placement
    of its connections favours one server."""

    def __init__(self, url: str, workers: int = 1):
        from mlflow.tracking import MlflowClient

        super().__init__(url, workers)
        client = MlflowClient(tracking_uri=url)
        exp = client.create_experiment(f"bench-{uuid.uuid4().hex[:6]}")
        self.run_id = client.create_run(exp).info.run_id
        self.ts = int(time.time() * 1000)
        self.sent_points = 0

    def _timestamps(self, n: int) -> range:
        with self._lock:  # a distinct millisecond timestamp per group
            start, self.ts = self.ts + 1, self.ts + n
        return range(start, start + n)

    def send(
        self, groups: list[list[float]], sender: int = 0, step: int | None = None, ranks: int = 1
    ) -> int:
        step = self.next_step() if step is None else step
        x = np.array(groups, dtype=np.float64)
        means, stds = x.mean(axis=1).tolist(), x.std(axis=1, ddof=1).tolist()
        points = [
            (key, value, ts, step)
            for mean, std, ts in zip(means, stds, self._timestamps(len(groups)), strict=True)
            for key, value in (("group_mean", mean), ("group_std", std))
        ]
        self.log_batch(sender, points)
        with self._lock:
            self.sent_points += len(points)
        return len(groups)

    def log_batch(self, sender: int, points: list[tuple[str, float, int, int]]) -> None:
        """Send ``(key, value, timestamp, step)`` points in one ``runs/log-batch`` call."""
        metrics = [{"key": k, "value": v, "timestamp": t, "step": s} for k, v, t, s in points]
        body = {"run_id": self.run_id, "metrics": metrics}
        self.post(sender, "/api/2.0/mlflow/runs/log-batch", body)


class StockMlflowSender(MlflowSender):
    """The same points through MLflow's own client, as a training script sends them:
    ``MlflowClient.log_batch`` with ``Metric`` entities, its shared connection pool, no placement
    on workers. Reported beside the fair measure (its client's overhead and placement are
    MLflow's, not the server's), not as the ratio."""

    def __init__(self, url: str, workers: int = 1):
        from mlflow.tracking import MlflowClient

        super().__init__(url, workers)
        self.stock = MlflowClient(tracking_uri=url)

    def prepare(self, senders: int) -> None:
        """Nothing to place: the stock client keeps its own pool."""

    def log_batch(self, sender: int, points: list[tuple[str, float, int, int]]) -> None:
        from mlflow.entities import Metric

        self.stock.log_batch(self.run_id, metrics=[Metric(*p) for p in points])
