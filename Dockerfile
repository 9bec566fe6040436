# Multi-stage build. `server` (the default target) holds the API and dashboard and no torch;
# `trainer` adds the GRPO trainer on a CUDA base for the compose `trainer` profile.
# Untested here: no Docker engine runs on the machines this project is built on.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY client ./client
COPY server ./server
COPY dashboard ./dashboard
COPY trainer ./trainer
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[server]"

FROM python:3.11-slim AS server
RUN useradd --create-home --uid 10001 vantage
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER vantage
WORKDIR /home/vantage
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=5 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2)"
# `vantage serve` waits for the database, upgrades the schema, then serves API and dashboard.
CMD ["vantage", "serve", "--host", "0.0.0.0", "--port", "8000"]

FROM pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime AS trainer
RUN useradd --create-home --uid 10001 vantage
COPY --from=build /src /src
RUN pip install --no-cache-dir "/src[trainer]" && rm -rf /src
USER vantage
WORKDIR /home/vantage
CMD ["vantage", "train", "gsm8k-gpu"]
