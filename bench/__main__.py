"""``python -m bench``: see :mod:`bench.run`."""

from __future__ import annotations

from bench.exit import hard_exit
from bench.run import main

if __name__ == "__main__":
    hard_exit(main())
