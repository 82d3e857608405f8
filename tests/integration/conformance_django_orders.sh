#!/usr/bin/env bash
# The HTTP conformance suite (tests/conformance) against the Django example,
# examples/django-orders (Django 5 on gunicorn, the Django middleware of
# client/python: the view's ORM writes and the key in one transaction.atomic),
# on a fresh database of the throwaway cluster. The service runs in the venv of
# client/python/tools/env.sh (the built wheel, psycopg's compiled speedups,
# Django, psycopg_pool, gunicorn): its bin is first on PATH, where the example's
# `env python3` finds it.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=lib/service.bash
source tests/integration/lib/service.bash
PATH=$(client/python/tools/env.sh /usr/bin/python3)/bin:$PATH
fresh_database idem_conformance_django
port=$((PGPORT + 26))
start_service "$port" examples/django-orders/app.py
wait_for_tables orders api_keys
/usr/bin/python3 tests/conformance/conformance.py --base-url "http://127.0.0.1:$port" \
  --dsn "host=$PGHOST port=$PGPORT dbname=$service_db user=${PGUSER:-postgres}"
