"""Entry point of a math verification worker process: `python -m klear.verifiers._math_worker TIMEOUT`."""

import sys

from klear.verifiers.math_verifier import _worker_main

if __name__ == "__main__":
    _worker_main(int(sys.argv[1]))
