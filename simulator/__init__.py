"""The fleet simulator: engines with a vLLM-like block pool, workloads, ground truth, sinks.

It publishes the same records a real fleet does (through the real publisher or straight
into the raw tables) and keeps the truth the analytics tests compare against.
"""
