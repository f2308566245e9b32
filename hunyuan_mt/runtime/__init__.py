"""The model in memory: the backbone loaded once per process and run with per-row adapters (`backbone`), and the
memory-pressure monitor with its light-mode policy (`pressure`).

May import everything below the scheduler (`config`, `text`, `host`, `kernels`, `quant`, `lora`, `decode`);
`adapters` only for type hints. The scheduler, the service and the doors above import it, never the reverse.
"""
