# The stand-in for the compose file's `caddy:<release>` image (no registry is reachable here): the
# same Caddy release, built from the Go module proxy by scripts/build-caddy.sh (the build context
# holds that binary), laid out like the official image (config in /config, certificates and
# Caddy's CA in /data, where the compose file's `caddy-data` volume mounts), with the official
# image's `wget` for the compose file's health check (from the base image). The binary replaces
# the base image's Debian caddy 2.6.2, which reads the Caddyfile differently.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY caddy /usr/bin/caddy
ENV XDG_CONFIG_HOME=/config \
    XDG_DATA_HOME=/data
RUN mkdir -p /config/caddy /data/caddy /etc/caddy && caddy version
WORKDIR /srv
CMD ["caddy", "run", "--config", "/etc/caddy/Caddyfile", "--adapter", "caddyfile"]
