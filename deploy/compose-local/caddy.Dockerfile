# The stand-in for `caddy:2.6.2` (no registry is reachable here): Debian bookworm's caddy 2.6.2, the
# version CI validates the Caddyfile with, laid out like the official image (config in /config,
# certificates and Caddy's CA in /data, where the compose file's `caddy-data` volume mounts), and
# the official image's `wget` for the compose file's health check. Both come with the base image.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ENV XDG_CONFIG_HOME=/config \
    XDG_DATA_HOME=/data
RUN mkdir -p /config/caddy /data/caddy /etc/caddy
WORKDIR /srv
CMD ["caddy", "run", "--config", "/etc/caddy/Caddyfile", "--adapter", "caddyfile"]
