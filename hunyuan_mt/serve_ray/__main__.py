"""`python -m hunyuan_mt.serve_ray` (the same as `python -m hunyuan_mt serve-ray`)."""

from .cli import main

raise SystemExit(main())
