"""uv's options for the package sources pip is configured with, one per line.

    python pip_to_uv.py            # reads `python -m pip config list`
    python pip_to_uv.py --from F   # reads that listing from file F ("-": standard input)

uv reads neither pip.conf nor PIP_* variables, so without this a machine whose pip goes
through a mirror, a local wheel folder or an extra index would have uv fetch everything from
PyPI instead (torch among it: several GB). Taken over: index-url, extra-index-url, find-links,
no-index and trusted-host; cert becomes SSL_CERT_FILE (printed as ``env SSL_CERT_FILE=...``).
pip's constraint files are not taken: the quickstart installs under the project's own
(scripts/constraints.txt). Where pip looks at several indexes it takes the best version among
them all; uv's ``unsafe-best-match`` strategy does the same (uv's default takes the first index
that has the package).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

#: pip's scopes, the one that wins last: environment variables override the files
SCOPES = ("global", "user", "site", ":env:")
LINE = re.compile(r"^(?P<scope>[^.]+|:env:)\.(?P<key>[a-z-]+)='(?P<value>.*)'$")


def read_config(text: str) -> dict:
    """``pip config list`` output -> {key: value}, each key from the scope that wins."""
    found: dict = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        scope = m["scope"]
        rank = SCOPES.index(scope) if scope in SCOPES else 0
        key = m["key"]
        if key not in found or rank >= found[key][0]:
            found[key] = (rank, m["value"])
    return {key: value for key, (_, value) in found.items()}


def uv_options(config: dict) -> list:
    """The uv pip install options (and ``env NAME=value`` lines) for pip's ``config``."""
    options = ["--index-strategy", "unsafe-best-match"]
    if config.get("no-index", "").lower() in ("1", "true", "yes", "on"):
        options.append("--no-index")
    if config.get("index-url"):
        options += ["--index-url", config["index-url"].split()[0]]
    for url in config.get("extra-index-url", "").split():
        options += ["--extra-index-url", url]
    for place in config.get("find-links", "").split():
        options += ["--find-links", place]
    for host in config.get("trusted-host", "").split():
        options += ["--allow-insecure-host", host]
    if config.get("cert"):
        options.append(f"env SSL_CERT_FILE={config['cert']}")
    return options


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="source", help="a saved `pip config list` (- for stdin)")
    opts = p.parse_args(argv)
    if opts.source == "-":
        text = sys.stdin.read()
    elif opts.source:
        with open(opts.source, encoding="utf-8") as f:
            text = f.read()
    else:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                              capture_output=True, text=True)
        text = proc.stdout if proc.returncode == 0 else ""  # no pip config: PyPI, as pip would
    print("\n".join(uv_options(read_config(text))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
