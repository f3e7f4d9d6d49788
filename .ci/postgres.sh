#!/usr/bin/env bash
# Start a local PostgreSQL for the integration tests and print the URL prefix to use.
# Installs Debian's package if the machine has none. Listens on 127.0.0.1 only.
set -euo pipefail
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    apt-get update -qq >/dev/null && apt-get install -y -qq postgresql >/dev/null
fi
version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
pg_lsclusters -h | grep -q "^$version main" || pg_createcluster "$version" main >/dev/null
pg_ctlcluster "$version" main start >/dev/null 2>&1 || true
for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 && break; sleep 1; done
password="tuner-ci-$(date +%s)"
su postgres -c "PGOPTIONS='-c client_min_messages=warning' psql -q -v ON_ERROR_STOP=1" <<SQL >/dev/null
DROP DATABASE IF EXISTS tuner_optuna;
DROP DATABASE IF EXISTS tuner_mlflow;
DROP ROLE IF EXISTS tuner_ci;
CREATE ROLE tuner_ci LOGIN PASSWORD '$password';
CREATE DATABASE tuner_optuna OWNER tuner_ci;
CREATE DATABASE tuner_mlflow OWNER tuner_ci;
SQL
echo "postgresql+psycopg2://tuner_ci:$password@127.0.0.1:5432"
