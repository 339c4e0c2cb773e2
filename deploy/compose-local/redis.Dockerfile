# The stand-in for `redis:7.0.15-bookworm`: Debian bookworm's redis-server 7.0.15 (the version tests
# run against), data in /data like the official image, not root.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY redis-entrypoint.sh /usr/local/bin/redis-entrypoint.sh
RUN mkdir -p /data && chown redis:redis /data && chmod 0755 /usr/local/bin/redis-entrypoint.sh
WORKDIR /data
USER redis
ENTRYPOINT ["/usr/local/bin/redis-entrypoint.sh"]
CMD ["redis-server"]
