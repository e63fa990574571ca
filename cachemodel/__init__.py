"""The cache model: the vLLM-like LRU block pool, access replay, Mattson stack distances and
the what-if math. Pure computation (schemas only), shared by the simulator and the analytics."""
