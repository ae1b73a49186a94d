"""A stand-in rank that started a worker pool: starts a sleeping child, prints the child's pid
and sleeps (the test stops it as the conformance runner stops a file).

Run by tests/tools/test_conformance.py."""

import subprocess
import sys
import time


def main():
    pool = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(pool.pid, flush=True)
    time.sleep(120)


if __name__ == "__main__":
    main()
