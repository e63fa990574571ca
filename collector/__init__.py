"""The ingest service (`kvscope collect`): `pipeline/` (Kafka -> decode -> columns -> plan ->
sink -> commit, exactly once) and `storage/` (the ClickHouse target, migrations, the table
catalogue, the derived residency)."""
