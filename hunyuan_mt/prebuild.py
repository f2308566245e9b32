"""`python -m hunyuan_mt.prebuild`: the background build's helper process (service/prebuild.py says what it
builds); kept here so the command the docs and running servers know goes on working."""

import sys

from .service.prebuild import main

if __name__ == "__main__":
    sys.exit(main())
