"""`python -m hunyuan_mt COMMAND ...` (see hunyuan_mt/cli.py)."""

from .cli import run

raise SystemExit(run())
