#!/bin/bash
# Run once by the clickhouse-server image on an empty data directory (compose mounts this
# folder at /docker-entrypoint-initdb.d). Creates kvscope_reader, the SELECT-only user
# Grafana and analysts read with; its password comes from KVSCOPE_READER_PASSWORD.
# docs/operations.md ("Security") has the same grants for a server you manage yourself.
set -euo pipefail
password=${KVSCOPE_READER_PASSWORD:?set KVSCOPE_READER_PASSWORD}
escaped=${password//\\/\\\\}
escaped=${escaped//\'/\\\'}
clickhouse client --user "$CLICKHOUSE_USER" --password "$CLICKHOUSE_PASSWORD" --multiquery <<SQL
CREATE SETTINGS PROFILE IF NOT EXISTS kvscope_readonly SETTINGS readonly = 2, max_execution_time = 60;
CREATE USER IF NOT EXISTS kvscope_reader IDENTIFIED WITH sha256_password BY '${escaped}'
    SETTINGS PROFILE 'kvscope_readonly';
GRANT SELECT ON ${CLICKHOUSE_DB}.* TO kvscope_reader;
SQL
