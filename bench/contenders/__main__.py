"""``python -m bench.contenders NAME SPEC_JSON``: run one single-process contender, print its result."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from bench.contenders import RESULT_MARKER, SINGLE_PROCESS, ContenderSpec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.contenders", description=__doc__, allow_abbrev=False
    )
    parser.add_argument("name", choices=SINGLE_PROCESS)
    parser.add_argument("spec", help="the ContenderSpec as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = ContenderSpec.from_json(json.loads(args.spec))
    if args.name == "ceiling":
        from bench.contenders.ceiling import run
    elif args.name == "handwritten":
        from bench.contenders.handwritten import run
    else:
        from bench.contenders.tuned import run
    result = run(spec)
    sys.stdout.write(RESULT_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    from bench.exit import hard_exit

    hard_exit(main())
