#!/usr/bin/env bash
# Assemble lib/ (every runtime jar of an OpenSearch 2.19.6 node, from Maven Central) and compile
# the embedded-node launcher. Idempotent: skips the work when lib/ and classes/ match the inputs.
set -euo pipefail
cd "$(dirname "$0")"
export JAVA_HOME="${JAVA_HOME:-/usr/lib/jvm/java-17-openjdk-amd64}"

stamp=$(cat pom.xml DevOpenSearch.java TenureAnalysisPlugin.java QueryAnalysis.java build.sh | sha256sum | cut -d' ' -f1)
if [ -f .built ] && [ "$(cat .built)" = "$stamp" ] && [ -f classes/DevOpenSearch.class ]; then
  exit 0
fi

rm -rf lib classes .built     # never keep stale jars: the wildcard classpath would load both versions
mkdir -p lib classes
mvn -B -q dependency:copy-dependencies -DoutputDirectory=lib -DincludeScope=runtime

# log4j-core is 'optional' in the server POM: add the one matching the resolved log4j-api
if ! ls lib/log4j-core-*.jar >/dev/null 2>&1; then
  V=$(ls lib | sed -n 's/^log4j-api-\(.*\)\.jar$/\1/p')
  [ -n "$V" ] || { echo "log4j-api not found in lib/" >&2; exit 1; }
  mvn -B -q dependency:copy -Dartifact="org.apache.logging.log4j:log4j-core:$V" -DoutputDirectory=lib
fi

# the 2.19 plugin class names the launcher loads (unzip exits 11 when an entry is absent)
unzip -l lib/analysis-common-*.jar 'org/opensearch/analysis/common/CommonAnalysisPlugin.class' >/dev/null
unzip -l lib/transport-netty4-client-*.jar 'org/opensearch/transport/Netty4Plugin.class' >/dev/null
unzip -l lib/lang-painless-*.jar 'org/opensearch/painless/PainlessPlugin.class' >/dev/null

"$JAVA_HOME/bin/javac" --release 17 -cp "lib/*" -d classes DevOpenSearch.java TenureAnalysisPlugin.java QueryAnalysis.java
echo "$stamp" > .built
echo "opensearch dev node built: $(ls lib | wc -l) jars"
