"""`python -m bitnet_gpu serve` for the server tests: the same command, and once it has exited
(SIGTERM, after finishing the requests in flight) the validation layer's messages of the whole
run, one a line after "VALIDATION:" on stderr, for the test to fail on."""

import sys

from bitnet_gpu import _core
from bitnet_gpu.__main__ import main

if __name__ == "__main__":
    code = main(["serve", *sys.argv[1:]])
    for message in _core.validation_messages():
        print("VALIDATION:", message.replace("\n", " "), file=sys.stderr)
    print(f"EXITED: {code}", file=sys.stderr)
    sys.exit(code)
