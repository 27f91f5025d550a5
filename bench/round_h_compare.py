"""Round H: a variant's simulated counts against the baseline's under ROUND_H_RULE (sim_time_to_quality.py).

usage: .venv/bin/python bench/round_h_compare.py BASELINE.json[,MORE.json] VARIANT.json[,MORE.json]
Each side may be several sim files (e.g. the scalar spaces and pareto_disagg run apart); a space the
variant lacks is taken from the baseline only when the variant cannot touch it (a scalar-only
candidate on a Pareto space), which the caller states with --same-as-baseline SPACE.
"""
import json
import statistics
import sys


def load(paths):
    out = {}
    for p in paths.split(","):
        for space, algos in json.load(open(p))["spaces"].items():
            out[space] = {int(s): r for s, r in algos["ours"].items()}
    return out

def counts(runs):
    return [r["evals_to_99"] if r["evals_to_99"] is not None else r["evaluations"] for _, r in sorted(runs.items())]

def main(argv):
    same = [a.split("=", 1)[1] for a in argv if a.startswith("--same-as-baseline=")]
    base, var = load(argv[0]), load(argv[1])
    for s in same:
        if s in base:
            var[s] = base[s]
    ratio_sum, ok = 0.0, True
    for space in ["goodput_agg", "pareto_disagg", "trace_agg", "disagg_goodput", "disagg_trace"]:
        if space not in base or space not in var:
            print(f"{space:15s} missing (counted as ratio 1, not passed)"); ok = False; ratio_sum += 1.0; continue
        assert sorted(base[space]) == sorted(var[space]), "different seeds"
        b, v = counts(base[space]), counts(var[space])
        reached = all(r["evals_to_99"] is not None for r in var[space].values())
        ratio = statistics.mean(v) / statistics.mean(b)
        ratio_sum += ratio
        better = sum(x < y for x, y in zip(v, b)); worse = sum(x > y for x, y in zip(v, b))
        line = (f"{space:15s} base {statistics.median(b):5.1f} / {statistics.mean(b):6.2f} / {max(b):3d}   "
                f"var {statistics.median(v):5.1f} / {statistics.mean(v):6.2f} / {max(v):3d}   ratio {ratio:.3f}  "
                f"better {better} worse {worse}")
        c1 = statistics.median(v) <= statistics.median(b)
        c3 = True
        if space == "pareto_disagg":
            c3 = sum(x > 35 for x in v) <= sum(x > 35 for x in b) and max(v) <= max(b)
            line += f"  >35: {sum(x > 35 for x in b)} -> {sum(x > 35 for x in v)}"
        if not (c1 and reached and c3):
            ok = False; line += "  FAILS" + (" (1)" if not c1 else "") + (" (2)" if not reached else "") + (" (3)" if not c3 else "")
        print(line)
    print(f"sum of mean ratios {ratio_sum:.3f}  -> {'PASSES' if ok and ratio_sum < 4.95 else 'fails'}"
          + ("" if ratio_sum < 4.95 else " (4)"))

if __name__ == "__main__":
    main(sys.argv[1:])
