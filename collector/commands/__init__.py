"""Subcommands of the `kvscope` CLI, one module each (see `kvscope.collector.cli`)."""
