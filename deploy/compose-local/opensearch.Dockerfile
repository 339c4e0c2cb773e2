# The stand-in for deploy/opensearch-image (the official image + analysis plugins): the same
# OpenSearch 2.19.6 node tests run, assembled from Maven Central jars (deploy/opensearch/, built by
# scripts/setup.sh), with Debian's OpenJDK 17. Build context: deploy/.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
WORKDIR /usr/share/opensearch
COPY opensearch/lib /usr/share/opensearch/lib
COPY opensearch/classes /usr/share/opensearch/classes
COPY opensearch/log4j2.properties /usr/share/opensearch/config/log4j2.properties
COPY compose-local/opensearch-entrypoint.sh /usr/local/bin/opensearch-entrypoint.sh
RUN useradd --system --uid 1000 --user-group --home-dir /usr/share/opensearch opensearch \
 && mkdir -p data snapshots logs tmp plugins modules \
 && touch config/opensearch.yml \
 && chown -R opensearch:opensearch /usr/share/opensearch \
 && chmod 0755 /usr/local/bin/opensearch-entrypoint.sh
USER opensearch
ENTRYPOINT ["/usr/local/bin/opensearch-entrypoint.sh"]
