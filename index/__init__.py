"""The global prefix index (`kvscope index`): exact per-source KV state from kvscope's stream,
restart-proof through the stored residency, answering routers' score requests."""
