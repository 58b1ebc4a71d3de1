"""Process exit for harness and contender processes that used pulsar clients."""

from __future__ import annotations

import logging
import os
import sys


def hard_exit(code: int) -> None:
    """Flush everything, then leave without interpreter finalisation.

    pulsar-client with a Python ``logger`` can abort at interpreter shutdown ("terminate called without
    an active exception", apache/pulsar-client-python#256, about 1 run in 20) even after every client
    was closed. By the time this is called, results are written and flushed, so skipping the
    finalisers loses nothing and keeps the exit code meaningful.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
