# The stand-in for `python:3.11-slim-bookworm` (no registry is reachable here): Debian bookworm's
# python3.11 with a virtualenv first on PATH, so `python`, `pip` and the console scripts resolve
# like in the official image. deploy/Dockerfile builds FROM this when PYTHON_IMAGE points at it.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt
# Certificate authorities the host added (scripts/compose-check.sh copies them; often none).
COPY ca-certificates/ /usr/local/share/ca-certificates/
RUN update-ca-certificates >/dev/null && python3.11 -m venv /opt/python
