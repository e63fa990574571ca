"""The KV-aware router (`kvscope route`): an OpenAI-compatible proxy that picks engines by
kvscope's prefix index and their load."""
