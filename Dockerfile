# The batchfill operator image: `docker build -t batchfill:0.1.0 .` (the Helm chart's default image).
# It runs `batchfill run` and installs the package's base dependencies only (pyproject.toml): no extra, so no
# tritonserver, onnxruntime or matplotlib. `make image-check` installs the same into a fresh venv and runs the
# operator's commands there (scripts/check_operator_image.py).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip install . \
 && rm -rf /src \
 && groupadd --system --gid 10001 batchfill \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin batchfill

# Numeric, so the kubelet can enforce runAsNonRoot; the chart sets the same uid.
USER 10001:10001
WORKDIR /
ENTRYPOINT ["batchfill"]
CMD ["run"]
