"""An offline corpus from text every Python installation has, as JSON-lines documents.

    python make_corpus.py OUTPUT_DIR [--max-mb 6]

Writes two files, so ``mmp data blend`` has two datasets to weight:

* ``pydoc_topics.jsonl``: the language reference help topics (``pydoc_data.topics``, the
  text behind ``help('if')``), one document per topic;
* ``stdlib_source.jsonl``: the standard library's own ``.py`` modules (tests and
  site-packages left out), one document per module, in sorted order, up to ``--max-mb``.

The same Python version gives the same corpus on every machine.
"""

import argparse
import json
import os
import sys
import sysconfig
from pathlib import Path


def topics():
    try:
        from pydoc_data.topics import topics as table
    except ImportError:  # some distributions split pydoc_data out
        return []
    return [f"{name}\n\n{text}" for name, text in sorted(table.items())]


def stdlib_modules(limit_bytes: int):
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__"}
    total = 0
    for path in sorted(root.rglob("*.py")):
        if skip.intersection(path.relative_to(root).parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        total += len(text.encode("utf-8"))
        if total > limit_bytes:
            break
        yield text


def write(path: Path, docs) -> int:
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            count += 1
    return count


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("output_dir")
    p.add_argument("--max-mb", type=float, default=6.0,
                   help="standard-library source to include, in MB (default %(default)s)")
    opts = p.parse_args(argv)
    out = Path(opts.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    n_topics = write(out / "pydoc_topics.jsonl", topics())
    n_modules = write(out / "stdlib_source.jsonl", stdlib_modules(int(opts.max_mb * 1e6)))
    if n_modules == 0:
        print(f"make_corpus: no standard-library source found under "
              f"{sysconfig.get_paths()['stdlib']}; this Python has no .py files to learn from",
              file=sys.stderr)
        return 1
    size = sum(os.path.getsize(out / f) for f in ("pydoc_topics.jsonl", "stdlib_source.jsonl"))
    print(f"corpus: {n_topics} help topics + {n_modules} standard-library modules, "
          f"{size / 1e6:.1f} MB in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
