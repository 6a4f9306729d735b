# model-call-capture sidecar image: `docker build -t model-call-capture .`
# Runs next to vLLM; every setting is an MCC_* environment variable (see README).

FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proxy ./proxy
COPY capture ./capture
COPY records ./records
COPY deploy/docker/constraints.txt ./
# A C compiler for the compiled per-event core (capture/_core.c, docs/speed.md): the wheel is built
# here with it; the image below gets the wheel, not the compiler.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# Every dependency pinned by the constraints file (hadolint DL3013).
# The store extra: --capture-store s3:// (fsspec, s3fs) works in the image as it comes.
RUN pip wheel --no-cache-dir --constraint constraints.txt --wheel-dir /wheels ".[store]"

FROM python:3.12-slim
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "model-call-capture[store]==0.1.0" \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 mcc \
    && useradd --system --uid 10001 --gid 10001 --create-home mcc \
    && mkdir -p /data/model-calls && chown 10001:10001 /data/model-calls
# Numeric, so Kubernetes can verify runAsNonRoot without resolving a name.
USER 10001:10001
ENV MCC_HOST=0.0.0.0 \
    MCC_PORT=8080 \
    MCC_CAPTURE_DIR=/data/model-calls \
    PYTHONUNBUFFERED=1
EXPOSE 8080
VOLUME ["/data/model-calls"]
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request, os; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ.get('MCC_PORT', '8080')}/-/healthy\", timeout=2)"]
ENTRYPOINT ["mcc", "serve"]
