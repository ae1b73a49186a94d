"""A stand-in rank that waits while a process it started (a data worker) computes: starts a
spinning child and sleeps.

Run by tests/tools/test_conformance.py."""

import subprocess
import sys
import time


def main():
    subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(60)


if __name__ == "__main__":
    main()
