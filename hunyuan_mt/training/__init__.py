"""Adapters made here: a LoRA adapter for one pair from a TSV/JSONL file (`train`) and the serving version
continued on users' corrections, scored in shadow and promoted only when it earns it (`retrain`).

May import the runtime, the store, `adapters`, `lora`, `text` and `demo`'s trainer; nothing in the serving path
imports it.
"""
