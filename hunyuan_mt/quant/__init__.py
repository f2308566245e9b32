"""The backbone's linear layers on the CPU: int8 weights and their three kernels (`int8`, `layer`, `fbgemm`,
`packed`), the int8 token table (`embedding`), and float GEMMs whose rows do not depend on their batch
(`invariant`).

May import `errors`, `host` and `kernels`; imported by `lora`, `decode` and `runtime`, never the other way.
"""
