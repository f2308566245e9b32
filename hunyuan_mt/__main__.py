"""`python -m hunyuan_mt COMMAND ...` (see hunyuan_mt/cli.py)."""

from .cli import main

raise SystemExit(main())
