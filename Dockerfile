# Multi-stage build. `server` (the default target) holds the API and dashboard and no torch;
# `trainer` adds the GRPO trainer on a CUDA base for the compose `trainer` profile. Builds with
# or without BuildKit (compose v1 on Docker 20.10 uses the classic builder).

FROM python:3.11-slim AS build
# The server's environment is built here and copied whole into the server stage: files copied in
# and deleted by a later step stay in the image as a dead layer (59 MB of wheels did).
RUN python -m venv /opt/vantage
ENV PATH=/opt/vantage/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The pinned dependencies first, in a layer of their own: a change of code reuses it. The
# versions are docker/constraints.txt's, so two builds install the same packages.
COPY docker/constraints.txt docker/constraints.txt
RUN pip install -r docker/constraints.txt
COPY pyproject.toml README.md ./
COPY client ./client
COPY server ./server
COPY dashboard ./dashboard
COPY trainer ./trainer
COPY migrations ./migrations
# pip and setuptools are for building: the server runs without them
RUN pip install -c docker/constraints.txt ".[server]" \
 && pip wheel --no-deps --wheel-dir /dist . \
 && python -m pip uninstall -y -q pip setuptools

FROM python:3.11-slim AS server
RUN useradd --create-home --uid 10001 vantage
COPY --from=build /opt/vantage /opt/vantage
ENV PATH=/opt/vantage/bin:$PATH PYTHONUNBUFFERED=1
USER vantage
WORKDIR /home/vantage
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=5 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2)"
# `vantage serve` waits for the database, upgrades the schema, then serves API and dashboard.
CMD ["vantage", "serve", "--host", "0.0.0.0", "--port", "8000"]

FROM pytorch/pytorch:2.4.1-cuda12.1-cudnn9-runtime AS trainer
# runs/ exists, owned by the user, before a volume is mounted on it: a named volume starts as a
# copy of it, so the trainer can write there (a folder Docker makes for a bind mount is root's).
RUN useradd --create-home --uid 10001 vantage \
 && install -d -o vantage -g vantage /home/vantage/runs
COPY --from=build /dist /opt/vantage-dist
COPY docker/constraints.txt /opt/vantage-dist/constraints.txt
RUN pip install --no-cache-dir -c /opt/vantage-dist/constraints.txt \
      "$(ls /opt/vantage-dist/vantage_rl-*.whl)[trainer]"
COPY docker/trainer-start.sh /usr/local/bin/vantage-trainer-start
USER vantage
WORKDIR /home/vantage
ENTRYPOINT ["vantage-trainer-start"]
CMD ["vantage", "train", "gsm8k-gpu"]
