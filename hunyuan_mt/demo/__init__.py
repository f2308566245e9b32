"""build-demo: rebuild the embedded demo model (data, tokenizer, backbone, per-direction adapters) from scratch."""
