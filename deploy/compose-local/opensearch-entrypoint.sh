#!/bin/bash
# Starts the Maven-built node (deploy/opensearch/DevOpenSearch.java) the way the official image's
# entrypoint starts OpenSearch: every environment variable named like a setting (cluster.name,
# discovery.type, path.repo, http.port ...) becomes a node setting, OPENSEARCH_JAVA_OPTS (heap)
# goes to the JVM. Variables without a dot (DISABLE_SECURITY_PLUGIN ...) are ignored: this node has
# no security plugin.
set -euo pipefail
home=/usr/share/opensearch
settings=()
while IFS= read -r -d '' pair; do
  name=${pair%%=*}
  if [[ $name =~ ^[a-z0-9_]+(\.[a-z0-9_]+)+$ ]]; then
    settings+=("$pair")
  fi
done < <(env -0)
# shellcheck disable=SC2086 # OPENSEARCH_JAVA_OPTS is a list of options, split on purpose
exec java ${OPENSEARCH_JAVA_OPTS:-} \
  -XX:+UseG1GC -Xss1m -Dio.netty.noUnsafe=true -Dio.netty.noKeySetOptimization=true \
  -Dio.netty.recycler.maxCapacityPerThread=0 -Dio.netty.allocator.numDirectArenas=0 \
  -Dlog4j.shutdownHookEnabled=false -Dlog4j2.disable.jmx=true -Djava.locale.providers=SPI,COMPAT \
  -Dfile.encoding=UTF-8 -Djava.awt.headless=true -XX:-OmitStackTraceInFastThrow \
  "-Djava.io.tmpdir=$home/tmp" -cp "$home/classes:$home/lib/*" \
  DevOpenSearch "$home" "${settings[@]}"
