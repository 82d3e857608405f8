#!/usr/bin/env bash
# Installs the client library (cmake --install) into a temporary prefix and
# builds a consumer against it twice: with find_package(idempotency_client) and
# with pkg-config. Both run one request end to end against the cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD_DIR:-build-test}
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"; psql -X -q -d postgres -c "DROP DATABASE IF EXISTS idem_consumer" >/dev/null 2>&1 || true' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
test -f "$prefix/include/idem/client.hpp"
test -f "$prefix/lib/cmake/idempotency_client/idempotency_client-config.cmake"
test -f "$prefix/lib/pkgconfig/idempotency_client.pc"

psql -X -q -v ON_ERROR_STOP=1 -d postgres -c "DROP DATABASE IF EXISTS idem_consumer" -c "CREATE DATABASE idem_consumer"
psql -X -q -v ON_ERROR_STOP=1 -d idem_consumer -c "CREATE EXTENSION idempotency"
dsn="host=$PGHOST port=$PGPORT dbname=idem_consumer user=${PGUSER:-postgres}"

echo "--- consumer built with find_package"
cmake -S tests/install_consumer -B "$prefix/consumer-cmake" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer-cmake" >/dev/null
"$prefix/consumer-cmake/consumer" "$dsn" cmake

echo "--- consumer built with pkg-config"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" g++ -o "$prefix/consumer-pc" tests/install_consumer/consumer.cpp \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs idempotency_client)
"$prefix/consumer-pc" "$dsn" pkgconfig
