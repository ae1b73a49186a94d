"""``<prefix>.mmp.json``: what a finished pair was built from, so a rerun can skip it.

A pair counts as done when its manifest names the same input (path, size, mtime), the same
settings (flags, tokenizer files' content, library versions) and sizes matching the ``.bin`` and
``.idx`` on disk. Anything else is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Optional

SUFFIX = ".mmp.json"
FORMAT = 1


def path_for(prefix: str) -> str:
    return prefix + SUFFIX


def input_stamp(path: str) -> dict:
    st = os.stat(path)
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def settings_hash(settings: dict) -> str:
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def read(prefix: str) -> Optional[dict]:
    try:
        with open(path_for(prefix), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_done(prefix: str, stamp: dict, digest: str) -> bool:
    record = read(prefix)
    if not record or record.get("format") != FORMAT:
        return False
    if record.get("input") != stamp or record.get("settings_hash") != digest:
        return False
    try:
        return (os.path.getsize(prefix + ".bin") == record.get("bin_bytes")
                and os.path.getsize(prefix + ".idx") == record.get("idx_bytes"))
    except OSError:
        return False


def write(prefix: str, record: dict) -> None:
    record = dict(record, format=FORMAT)
    tmp = path_for(prefix) + f".tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path_for(prefix))


def clear(prefix: str) -> None:
    try:
        os.remove(path_for(prefix))
    except FileNotFoundError:
        pass
