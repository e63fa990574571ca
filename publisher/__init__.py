"""kvscope's engine side: light enough to live inside an inference engine process.

Never imports ClickHouse, chDB, pandas or matplotlib.
"""
