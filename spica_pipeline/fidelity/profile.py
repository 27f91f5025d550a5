"""Calibration profiles: the file format, its validation, and which file a sweep uses.

A profile maps what the replay measures to what real GPUs measured, per phase (TTFT, TPOT). `fit.py` writes
one from bench records, `apply.py` applies one to a replay's report. The JSON object:

* "replay": {phase: "client" | "sweep"}, which replay a phase corrects: "client" = the candidate replayed as
  the benchmark client that measured the silicon rows (measurement.benchmark_client_request), which a sweep
  runs beside its own; "sweep" = the sweep's own measurement (ramped clients, steady-state window);
* "terms": {phase: [{"feature": "log2_concurrency_per_engine", "coefficient": b, "anchor": a, "centre",
  "fitted"}]}: the load term exp(b (x - a)), x = log2 of the concurrency per engine of the phase's role;
* "slices" {"<system>/<backend>/<phase>"}, "backend" {"<backend>/<phase>"}, "phase" {phase}: entries
  {"factor", "band": [lo, hi] (natural log of the P10 and P90 multipliers), "rows"}; a candidate reads its
  slice, else its backend's entry, else its phase's, the last two with the band widened FALLBACK_WIDEN x;
* "overhead_ms" {"<backend>/<phase>": ms} (format 5 only): added to the replayed value before the factor;
* format 6 (TRANSFER_FORMAT, fidelity/transfer.py): each entry carries its own correction, replacing the
  profile-wide ones: "terms" [load terms] (the phase's "terms" are then empty), "overhead_ms" ms (absent: none),
  "correction" (the candidate chosen) and "transfer" (its leave-one-architecture-out errors and every candidate's
  score, for people);
* "sweep_fallback": a profile correcting the sweep's own replay, for candidates without a client replay
  (required when some phase corrects the client replay);
* "own_bands" (optional): {"<k>": {phase: [lo, hi]}}, the band of a profile fitted on k of a model's own
  measurements (fidelity/own.py), measured on the calibration split;
* "fixed_lengths" (optional): a profile for benchmark clients that send exactly the workload's lengths,
  replayed so (`uses_fixed_lengths`), with no "fixed_lengths" of its own;
* "own" (optional): the profile was fitted on a model's own measurements (fidelity/own.py, `spica calibrate`):
  {"model", "system", "backend", "precision" ({field: mode}, empty for the checkpoint's own), "rows", "factors",
  "leave_one_out", "measurements", "base"}; it corrects that (model, system, backend, precision) only, and a sweep
  of another model, system or precision refuses it (`own_mismatch`);
* "format" 6, 5 (profile-wide terms and overheads) or 2 (5 without "overhead_ms"); "method", "method_name", "fitted", "source", "rows_used",
  "band_method", "provenance": how it was fitted, for people (lookups never read them).

`auto` is the packaged profile, unless the profile directory (`profile_dir`: $SPICA_PROFILE_DIR, else
$XDG_CONFIG_HOME/spica/profiles, else ~/.config/spica/profiles) holds an own profile of the sweep's model, system,
precision and one of its backends (`find_own_profile`): that one wins. A missing or corrupt file is a ConfigError
naming the path (exit 2). Each packaged profile's one held-out
check (its errors on models it was never fitted on) is recorded in data/heldout_checks.json by
bench/record_heldout_check.py, keyed by the profile file's digest: a changed file has no check.
"""

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from spica_pipeline.errors import ConfigError, one_line

PHASES = ("ttft", "tpot")
REPLAYS = ("sweep", "client")
LOAD = "log2_concurrency_per_engine"
FORMAT = 5  # with "overhead_ms"
PLAIN_FORMAT = 2  # without
TRANSFER_FORMAT = 6  # every entry with its own correction
READABLE_FORMATS = (PLAIN_FORMAT, FORMAT, TRANSFER_FORMAT)
FIXED_LENGTHS = "fixed_lengths"
SWEEP_FALLBACK = "sweep_fallback"
FALLBACK_WIDEN = 1.5  # a parent entry read for a slice the profile has no rows of
BAND_LEVELS = ("backend", "phase")

PACKAGED = Path(__file__).resolve().parent / "data" / "replay-v16.json"
HELDOUT_CHECKS = PACKAGED.parent / "heldout_checks.json"
RAW = "none"  # the held-out check of uncalibrated sweep numbers (`evaluation.calibration: none`)
OWN = "own"
PROFILE_DIR_ENV = "SPICA_PROFILE_DIR"


class ProfileError(ValueError):
    """A calibration profile that is not a valid profile (the caller names the file)."""


def number(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate(profile: Any) -> dict[str, Any]:
    """`profile` itself, or ProfileError naming the first thing that is not the format above."""
    if not isinstance(profile, dict):
        raise ProfileError("not a JSON object")
    fmt = profile.get("format")
    if fmt not in READABLE_FORMATS:
        raise ProfileError(f"format {fmt!r} is not one of {list(READABLE_FORMATS)}")
    for key in ("slices", "backend", "phase", "rows_used", "method", "fitted", "terms"):
        if key not in profile:
            raise ProfileError(f"missing key {key!r}")
    for section in ("slices", "backend", "phase"):
        if not isinstance(profile[section], dict):
            raise ProfileError(f"{section} must be an object")
        for name, entry in profile[section].items():
            _check_entry(f"{section}.{name}", entry, fmt)
    if set(profile["phase"]) != set(PHASES):
        raise ProfileError(f"phase must cover {list(PHASES)}")
    replay = profile.get("replay", {})
    if not isinstance(replay, dict) or set(replay) - set(PHASES) \
            or any(replay.get(p, "sweep") not in REPLAYS for p in PHASES):
        raise ProfileError(f"replay must map {list(PHASES)} to one of {list(REPLAYS)}, got {replay!r}")
    _check_terms(profile["terms"])
    _check_overhead(profile.get("overhead_ms"), fmt)
    _check_band_method(profile.get("band_method"))
    _check_own_bands(profile.get("own_bands"))
    _check_own(profile.get(OWN))
    fixed = profile.get(FIXED_LENGTHS)
    if fixed is not None:
        if not isinstance(fixed, dict) or FIXED_LENGTHS in fixed:
            raise ProfileError(f"{FIXED_LENGTHS} must be a profile without a {FIXED_LENGTHS} of its own")
        _nested(FIXED_LENGTHS, fixed)
    if needs_client(profile):
        fallback = profile.get(SWEEP_FALLBACK)
        if not isinstance(fallback, dict):
            raise ProfileError(f"a profile with a client phase needs '{SWEEP_FALLBACK}' (for sweeps without "
                               "that replay)")
        _nested(SWEEP_FALLBACK, fallback)
        if needs_client(fallback):
            raise ProfileError(f"{SWEEP_FALLBACK} must correct the sweep replay only")
    return profile


def _nested(key: str, sub: dict[str, Any]) -> None:
    try:
        validate(sub)
    except ProfileError as exc:
        raise ProfileError(f"{key}: {exc}") from None


def _check_entry(where: str, entry: Any, fmt: Any) -> None:
    f = entry.get("factor") if isinstance(entry, dict) else None
    band = entry.get("band") if isinstance(entry, dict) else None
    if not number(f) or f <= 0:
        raise ProfileError(f"{where}.factor must be a positive number, got {f!r}")
    if not isinstance(band, list) or len(band) != 2 or not all(number(x) for x in band) or band[0] > band[1]:
        raise ProfileError(f"{where}.band must be [lo, hi] with lo <= hi, got {band!r}")
    own = {k for k in ("terms", "overhead_ms") if k in entry}
    if own and fmt != TRANSFER_FORMAT:
        raise ProfileError(f"{where}: an entry's own {sorted(own)} needs format {TRANSFER_FORMAT}")
    if fmt == TRANSFER_FORMAT and "terms" not in entry:
        raise ProfileError(f"{where}: a format {TRANSFER_FORMAT} entry carries its own terms")
    if "terms" in entry:
        _check_term_list(f"{where}.terms", entry["terms"])
    ms = entry.get("overhead_ms", 0.0)
    if not number(ms) or ms < 0:
        raise ProfileError(f"{where}.overhead_ms must be a number >= 0, got {ms!r}")


def _check_terms(terms: Any) -> None:
    if not isinstance(terms, dict) or set(terms) - set(PHASES):
        raise ProfileError(f"terms must map phases {list(PHASES)} to lists of terms")
    for phase in PHASES:
        _check_term_list(f"terms.{phase}", terms.get(phase))


def _check_term_list(where: str, terms: Any) -> None:
    if not isinstance(terms, list):
        raise ProfileError(f"{where} must be a list")
    for i, t in enumerate(terms):
        if not isinstance(t, dict) or t.get("feature") != LOAD or not number(t.get("coefficient")) \
                or not number(t.get("centre")) or not number(t.get("anchor", 0.0)):
            raise ProfileError(f"{where}[{i}] must be {{feature: {LOAD!r}, coefficient, centre, anchor}}, got {t!r}")


def _check_overhead(overhead: Any, fmt: Any) -> None:
    if overhead is None and fmt != FORMAT:
        return
    if fmt != FORMAT or not isinstance(overhead, dict) or not overhead:
        raise ProfileError(f"overhead_ms (a non-empty object) and format {FORMAT} go together")
    for key, ms in overhead.items():
        backend, _, phase = key.partition("/")
        if phase not in PHASES or not backend or not number(ms) or ms < 0:
            raise ProfileError(f"overhead_ms.{key}: keys are '<backend>/<phase>', values ms >= 0, got {ms!r}")


def _check_band_method(band_method: Any) -> None:
    if band_method is None:
        return
    if not isinstance(band_method, dict) or set(band_method) != set(PHASES):
        raise ProfileError(f"band_method must map {list(PHASES)} to band methods, got {band_method!r}")
    for phase, bm in band_method.items():
        if not isinstance(bm, dict) or bm.get("level") not in BAND_LEVELS or bm.get("balanced") is not True \
                or not number(bm.get("spread")) or bm["spread"] <= 0:
            raise ProfileError(f"band_method.{phase} must be {{level: one of {list(BAND_LEVELS)}, balanced: true, "
                               f"spread > 0}}, got {bm!r}")


def _check_own_bands(own: Any) -> None:
    if own is None:
        return
    if not isinstance(own, dict) or not own:
        raise ProfileError(f"own_bands must map row counts to {{phase: [lo, hi]}}, got {own!r}")
    for k, entry in own.items():
        if not k.isdigit() or not isinstance(entry, dict) or set(entry) != set(PHASES):
            raise ProfileError(f"own_bands.{k} must be {{phase: [lo, hi]}} for {list(PHASES)} under a row count")
        for phase, b in entry.items():
            if not isinstance(b, list) or len(b) != 2 or not all(number(x) for x in b) or b[0] > b[1]:
                raise ProfileError(f"own_bands.{k}.{phase} must be [lo, hi] with lo <= hi, got {b!r}")


def _check_own(own: Any) -> None:
    if own is None:
        return
    if not isinstance(own, dict):
        raise ProfileError(f"{OWN} must be an object, got {own!r}")
    for key in ("model", "system", "backend"):
        if not isinstance(own.get(key), str) or not own[key]:
            raise ProfileError(f"{OWN}.{key} must be a name, got {own.get(key)!r}")
    rows = own.get("rows")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ProfileError(f"{OWN}.rows must be a row count >= 1, got {rows!r}")
    precision = own.get("precision", {})
    if not isinstance(precision, dict) or not all(isinstance(v, str) for v in precision.values()):
        raise ProfileError(f"{OWN}.precision must map precision fields to modes, got {precision!r}")


def replay_basis(profile: Mapping[str, Any], phase: str) -> str:
    """Which replay a profile corrects for one phase (REPLAYS)."""
    return str((profile.get("replay") or {}).get(phase, "sweep"))


def needs_client(profile: Mapping[str, Any]) -> bool:
    """Whether a profile corrects the benchmark-client replay in some phase (a sweep then runs that replay)."""
    return any(replay_basis(profile, p) == "client" for p in PHASES)


def fixed_length_backends(profile: Mapping[str, Any]) -> frozenset[str]:
    """The backends a profile has fixed-length factors for: those its FIXED_LENGTHS entry was fitted on."""
    fixed = profile.get(FIXED_LENGTHS) or {}
    return frozenset(key.split("/", 1)[0] for key in fixed.get("backend", {}))


def uses_fixed_lengths(profile: Mapping[str, Any], client_lengths: str | None, backend: str | None) -> bool:
    """Whether a workload whose benchmark client sends `client_lengths` ('spread' or 'fixed', the evaluation
    section) on `backend` is replayed with fixed lengths and corrected by the FIXED_LENGTHS sub-profile: a
    fixed-length client replayed in lockstep is another quantity than the spread replay the main factors
    correct, so only where that sub-profile was fitted on the backend's rows; elsewhere the main factors."""
    return client_lengths == "fixed" and backend in fixed_length_backends(profile)


def for_client(profile: Mapping[str, Any], client_lengths: str | None, backend: str | None) -> Mapping[str, Any]:
    """The factors for that workload (`uses_fixed_lengths`): the FIXED_LENGTHS sub-profile or the main ones."""
    return profile[FIXED_LENGTHS] if uses_fixed_lengths(profile, client_lengths, backend) else profile


# ---- files -----------------------------------------------------------------------------------------

_memo: dict[tuple[str, int, int], tuple[dict[str, Any], str]] = {}


def resolve(setting: str | None) -> Path | None:
    """`auto` -> the packaged profile, `none` -> None, anything else is a path."""
    if setting is None or setting == "none":
        return None
    return PACKAGED if setting == "auto" else Path(setting).expanduser()


def load_profile(setting: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(validated profile, sha256[:16] of the file) or (None, None) for `none`; ConfigError naming the path."""
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
    """The recorded held-out check of the profile `setting` resolves to (`none`: the raw sweep replay's), or
    None when that exact file was never checked (a user profile, an edited copy). An own profile has no held-out
    rows: its check is what it knows of itself under "own" (`own_summary`: its rows and their leave-one-out
    errors), beside its base's held-out check for the other backends (the corrections it carries for them).
    With `client_lengths` 'fixed', the backends the profile's fixed-length factors serve are left out: the check
    measured the main factors on spread-client rows, and no held-out row has a fixed-length client, so those
    backends' numbers are "not measured" rather than another factor's errors."""
    try:
        recorded = json.loads(checks.read_text())["checks"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if resolve(setting) is None:
        return recorded.get(RAW)
    profile, digest = load_profile(setting)
    own = own_of(profile)
    if own is not None and profile is not None:
        return _own_check(profile, str(resolve(setting)), recorded)
    check = recorded.get(digest or "")
    if check is None or profile is None or client_lengths != "fixed":
        return check
    by_backend = check.get("by_backend", {})
    kept = {b: v for b, v in by_backend.items() if not uses_fixed_lengths(profile, client_lengths, b)}
    left = sorted(set(by_backend) - set(kept))
    note = (f"{', '.join(left)}: ranked with the profile's fixed-length factors (evaluation.client_lengths: fixed), "
            "which no held-out row measures (no held-out model was measured by a fixed-length client; their "
            "leave-one-model-out errors are in docs/fidelity.md)") if left else None
    return {**check, "by_backend": kept, **({"note": note} if note else {})}


def _own_check(profile: Mapping[str, Any], name: str, recorded: Mapping[str, Any]) -> dict[str, Any]:
    own = own_of(profile) or {}
    base = recorded.get(str((own.get("base") or {}).get("sha256"))) or {}
    others = {b: v for b, v in (base.get("by_backend") or {}).items() if b != own.get("backend")}
    kept = {k: v for k, v in base.items() if k not in ("by_backend", "profile", "all", "band_coverage")}
    return {**kept, "profile": name, "base_profile": base.get("profile"), "by_backend": others,
            OWN: own_summary(profile, name)}


# ---- own profiles: the profile directory, `auto`'s lookup, and the sweep they belong to ----------------

def profile_dir() -> Path:
    """Where `auto` looks for own profiles: $SPICA_PROFILE_DIR, else $XDG_CONFIG_HOME/spica/profiles, else
    ~/.config/spica/profiles."""
    given = os.environ.get(PROFILE_DIR_ENV)
    if given:
        return Path(given).expanduser()
    config_home = os.environ.get("XDG_CONFIG_HOME")
    return (Path(config_home).expanduser() if config_home else Path.home() / ".config") / "spica" / "profiles"


def own_of(profile: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The profile's "own" section (it was fitted on a model's own measurements), or None."""
    own = (profile or {}).get(OWN)
    return own if isinstance(own, Mapping) else None


def deployment_text(model: object, system: object, precision: Mapping[str, Any] | None,
                    backend: object = None) -> str:
    """`model on system[ with backend][, precision weights fp8]` (the checkpoint's own precision unnamed)."""
    text = f"{model} on {system}" + (f" with {backend}" if backend else "")
    if precision:
        text += ", precision " + ", ".join(f"{k} {v}" for k, v in sorted(precision.items()))
    return text


def own_mismatch(profile: Mapping[str, Any] | None, *, model: str, system: str,
                 precision: Mapping[str, str]) -> str | None:
    """Why an own profile does not belong to a sweep of (model, system, precision), naming both; None when it does
    (or the profile is not an own one). The backend may differ: its candidates read the base corrections."""
    own = own_of(profile)
    if own is None:
        return None
    theirs = dict(own.get("precision") or {})
    if own["model"] == model and own["system"] == system and theirs == dict(precision):
        return None
    return (f"is the own profile of {deployment_text(own['model'], own['system'], theirs, own['backend'])}, "
            f"and this sweep is {deployment_text(model, system, precision)}: fit one on this model's measurements "
            "with `spica calibrate`, or use `auto`")


def find_own_profile(*, model: str, system: str, backends: Sequence[str], precision: Mapping[str, str],
                     directory: Path | None = None) -> tuple[Path | None, list[str]]:
    """(the own profile `auto` uses for a sweep, notes): in `directory` (profile_dir()), the *.json own profiles of
    the sweep's model, system and precision whose backend it searches; the first searched backend that has one
    wins, the newest fit of it (its "fitted", then the file name). A sweep reads one profile, so own profiles of
    its other backends are named in the notes and not used; files that are not valid profiles are named too."""
    where = profile_dir() if directory is None else directory
    if not where.is_dir():
        return None, []
    found: dict[str, list[tuple[str, str, Path]]] = {}
    notes: list[str] = []
    for path in sorted(where.glob("*.json")):
        try:
            profile, _ = load_profile(str(path))
        except ConfigError as err:
            notes.append(f"{path} is skipped: {err}")
            continue
        own = own_of(profile)
        if own is None or own_mismatch(profile, model=model, system=system, precision=precision) is not None:
            continue
        if own["backend"] in backends:
            found.setdefault(str(own["backend"]), []).append((str((profile or {}).get("fitted", "")), path.name, path))
    chosen = next((b for b in backends if b in found), None)
    if chosen is None:
        return None, notes
    path = max(found[chosen])[2]
    notes += [f"own profile {max(found[b])[2]} ({b}) is not used: a sweep reads one profile, and {path} ({chosen}) "
              f"comes first in search_space.backend; sweep {b} apart to use it" for b in found if b != chosen]
    return path, notes


def own_summary(profile: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What a report says of an own profile: its file, the deployment, rows, factors, leave-one-out errors and the
    band its own entries carry (log P10 / P90 per phase)."""
    own = own_of(profile) or {}
    key = f"{own.get('system')}/{own.get('backend')}"
    return {"profile": name, "kind": OWN, "fitted": profile.get("fitted"),
            **{k: own.get(k) for k in ("model", "system", "backend", "precision", "rows", "factors", "leave_one_out",
                                       "base")},
            "band": {p: (profile["slices"].get(f"{key}/{p}") or {}).get("band") for p in PHASES}}
