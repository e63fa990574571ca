"""The `kvscope` command line: `main` (parser, global flags, error reporting) and
`commands/` (one module per subcommand, each importing its heavy dependencies only when run)."""
