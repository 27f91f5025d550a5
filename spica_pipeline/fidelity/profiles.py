"""Calibration profiles on disk: the packaged, versioned profile or a user file (`evaluation.calibration`).

A profile is JSON written by `bench/bench_fidelity.py --fit-calibration` (format and method in
fidelity/calibration.py). A missing or corrupt file is a ConfigError naming the path (exit 2).

Each packaged profile's one held-out check (its errors on the models it was never fitted on, from
`bench/bench_fidelity.py --split heldout`) is recorded in `calibration/heldout_checks.json` by
`bench/record_heldout_check.py`, keyed by the profile file's digest, so report.md and the deploy
records can say how far that profile was off on unseen models, and a changed file says nothing.
"""

import hashlib
import json
from pathlib import Path
from typing import Any

from spica_pipeline.errors import ConfigError, one_line

PACKAGED = Path(__file__).resolve().parent / "data" / "replay-v15.json"
HELDOUT_CHECKS = PACKAGED.parent / "heldout_checks.json"
RAW = "none"  # the held-out check of uncalibrated sweep numbers (`evaluation.calibration: none`)

_memo: dict[tuple[str, int, int], tuple[dict[str, Any], str]] = {}


def resolve(setting: str | None) -> Path | None:
    """`auto` -> the packaged profile, `none` -> None, anything else is a path."""
    if setting is None or setting == "none":
        return None
    return PACKAGED if setting == "auto" else Path(setting).expanduser()


def load_profile(setting: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(validated profile, sha256 of the file) or (None, None) for `none`; ConfigError naming the path."""
    from spica_pipeline.fidelity.calibration import ProfileError, validate

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


def heldout_check(setting: str | None, checks: Path = HELDOUT_CHECKS,
                  client_lengths: str | None = None) -> dict[str, Any] | None:
    """The recorded held-out check of the profile `setting` resolves to (`none`: the raw sweep
    replay's), or None when that exact file was never checked (a user profile, an edited copy).
    With `client_lengths` 'fixed', the backends the profile's fixed-length factors serve are left out:
    the check measured the main factors on spread-client rows, and no held-out row has a fixed-length
    client, so those backends' numbers are "not measured" rather than another factor's errors."""
    from spica_pipeline.fidelity.calibration import uses_fixed_lengths

    try:
        recorded = json.loads(checks.read_text())["checks"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if resolve(setting) is None:
        return recorded.get(RAW)
    profile, digest = load_profile(setting)
    check = recorded.get(digest or "")
    if check is None or profile is None or client_lengths != "fixed":
        return check
    by_backend = check.get("by_backend", {})
    kept = {b: v for b, v in by_backend.items() if not uses_fixed_lengths(profile, client_lengths, b)}
    left = sorted(set(by_backend) - set(kept))
    note = (f"{', '.join(left)}: ranked with the profile's fixed-length factors (evaluation.client_lengths: fixed), "
            "which no held-out row measures (no held-out model was measured by a fixed-length client; their "
            "leave-one-model-out errors are in docs/fidelity.md, round 15)") if left else None
    return {**check, "by_backend": kept, **({"note": note} if note else {})}
