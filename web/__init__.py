"""The one HTTP base of kvscope's services (`kvscope index`, `kvscope route`, `kvscope serve`):
Starlette + uvicorn with the request limits enforced while reading, the bearer-token check,
JSON error bodies in each service's own shape, `/healthz` from a readiness callable and
`/metrics` from a registry, and one way to listen and stop. Service side only: the engine
side never imports it."""
