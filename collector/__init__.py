"""kvscope's service side: Kafka -> ClickHouse collector, migrations, queries, reports, CLI."""
