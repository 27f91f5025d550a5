"""Calibration profiles on disk: the packaged, versioned profile or a user file (`evaluation.calibration`).

A profile is JSON written by `bench/bench_fidelity.py --fit-calibration` (format and method in
search/calibration.py). A missing or corrupt file is a ConfigError naming the path (exit 2).
"""

import hashlib
import json
from pathlib import Path
from typing import Any

from spica_pipeline.errors import ConfigError, one_line

PACKAGED = Path(__file__).resolve().parent.parent / "calibration" / "replay-v8.json"

_memo: dict[tuple[str, int, int], tuple[dict[str, Any], str]] = {}


def resolve(setting: str | None) -> Path | None:
    """`auto` -> the packaged profile, `none` -> None, anything else is a path."""
    if setting is None or setting == "none":
        return None
    return PACKAGED if setting == "auto" else Path(setting).expanduser()


def load_profile(setting: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(validated profile, sha256 of the file) or (None, None) for `none`; ConfigError naming the path."""
    from spica_pipeline.search.calibration import ProfileError, validate

    path = resolve(setting)
    if path is None:
        return None, None
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    except OSError as exc:
        raise ConfigError(f"evaluation.calibration: cannot read calibration profile {path}: "
                          f"{exc.strerror or exc}") from None
    if key in _memo:
        return _memo[key]
    try:
        raw = path.read_bytes()
        profile = validate(json.loads(raw))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, ProfileError) as exc:
        raise ConfigError(f"evaluation.calibration: {path} is not a valid calibration profile: "
                          f"{one_line(exc)}") from None
    out = (profile, hashlib.sha256(raw).hexdigest()[:16])
    _memo[key] = out
    return out
