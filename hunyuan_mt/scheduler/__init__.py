"""Who runs when: the engine's iteration-level batching of rows of many pairs (`engine`), a request's handle on
its rows (`ticket`), the route of a pair (`router`), and the callers and their fair shares of what everyone shares
(`callers`, `shares`).

May import the runtime and everything below it; `documents`, the service and the doors import it. Nothing here
imports the service or the web layer.
"""
