# The vramfabric image, built once by `docker compose build`: a container starts with
# everything installed and fetches nothing. EXTRAS="[gpu]" adds CuPy and NVML for GPU workers.
FROM python:3.11-slim
ARG EXTRAS=""
WORKDIR /src
COPY pyproject.toml README.md ./
COPY broker broker
COPY worker worker
COPY coordinator coordinator
COPY kernels kernels
COPY fabric fabric
RUN pip install --no-cache-dir --disable-pip-version-check ".${EXTRAS}" \
    && useradd --system --create-home vf
USER vf
WORKDIR /home/vf
# Metrics servers listen beyond loopback so Prometheus in its own container can scrape them.
ENV VRAMFABRIC_METRICS_ADDR=0.0.0.0 PYTHONUNBUFFERED=1
ENTRYPOINT ["vramfabric"]
CMD ["--help"]
