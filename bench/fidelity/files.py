"""Result files of the fidelity bench: reading them (from the checkout or from git history), the compact replays
file a profile is fitted and scored on, and writing JSON."""

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from spica_pipeline.storage import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]

# what fitting and scoring read of a replayed row (fidelity/records.py), and what the reports group by
COMPACT_KEYS = ("id", "split", "status", "reason", "model", "precision", "system", "backend",
                "silicon_backend_version", "mode", "isl", "osl", "concurrency", "shape", "benchmark_client",
                "client_lengths", "silicon", "ours", "sweep", "aic", "window_rule", "fidelity_note")


def read_json(name: str) -> dict[str, Any]:
    """A JSON file: a path, or REV:PATH for the file as it was at a git revision (`git show`)."""
    path = Path(name)
    if not path.exists() and ":" in name:
        rev, _, inner = name.partition(":")
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{inner}"], capture_output=True, text=True)
        if shown.returncode != 0:
            raise OSError(f"{name}: {shown.stderr.strip() or 'not in git history'}")
        return json.loads(shown.stdout)
    return json.loads(path.read_text())


def records_by_id(paths: str, split: str | None = None) -> dict[str, dict[str, Any]]:
    """The records of comma-separated result files joined by row id, the first file's wins; with `split`, only
    that split's records are read (a file of both splits: its other rows stay unread)."""
    out: dict[str, dict[str, Any]] = {}
    for name in paths.split(","):
        if name:
            data = read_json(name)
            lengths = _client_lengths_of(data)
            if not isinstance(data.get("records"), list):
                raise ValueError(f"{name}: not a fidelity result (no records)")
            for r in data["records"]:
                if split is None or r.get("split") == split:
                    out.setdefault(r["id"], {"client_lengths": lengths, **r} if lengths else r)
    return out


def _client_lengths_of(data: dict[str, Any]) -> str | None:
    """How a result file's client replays drew lengths, for files whose records do not say ('fixed' for a
    --fixed-lengths run, else 'spread': each row's benchmark client, AIC's runners' rows as a sweep replays them)."""
    if not data.get("records") or "client_lengths" in data["records"][0]:
        return None
    return "fixed" if data.get("client_lengths") == "fixed" or "--fixed-lengths" in data.get("command", "") \
        else "spread"


def compact(record: dict[str, Any], source: int) -> dict[str, Any]:
    """A record with only COMPACT_KEYS (the replays' means only) and the index of the file it came from."""
    out = {k: record[k] for k in COMPACT_KEYS if k in record}
    for side in ("ours", "sweep"):
        if isinstance(out.get(side), dict):
            out[side] = {p: out[side].get(p) for p in ("ttft", "tpot")}
    out["from"] = source
    return out


def write_replays(path: str, records: list[dict[str, Any]], sources: list[str], command: str,
                  split: str) -> None:
    """The compact replays file: a header, then one record per line (diffs stay readable)."""
    header = {"bench": "fidelity_replays", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "command": command, "split": split,
              "sources": [{"file": name, "command": read_json(name).get("command")} for name in sources],
              "note": "each record: the first source that holds the row ('from' indexes 'sources'); only what "
                      "fitting and scoring read (spica_pipeline/fidelity/records.py)"}
    lines = [json.dumps(r, sort_keys=True, separators=(",", ":"), allow_nan=False) for r in records]
    text = json.dumps(header, indent=1, sort_keys=True)[:-2] + ',\n "records": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    json.loads(text)  # the file is JSON
    _write(path, text)


def write_json(path: str, data: dict[str, Any]) -> None:
    _write(path, json.dumps(data, indent=1, sort_keys=True, allow_nan=False, default=lambda o: None) + "\n")


def _write(path: str, text: str) -> None:
    atomic_write_text(Path(path), text)


def version(dist: str) -> str:
    try:
        from importlib.metadata import version as installed

        return installed(dist)
    except Exception:
        return "unknown"
