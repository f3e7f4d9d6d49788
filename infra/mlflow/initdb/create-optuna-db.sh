#!/bin/sh
# Run once by the postgres image on an empty data directory (/docker-entrypoint-initdb.d).
# MLflow's database ($POSTGRES_DB, "mlflow") exists by then; Optuna's storage gets its own.
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -c 'CREATE DATABASE optuna'
