"""Errors of every capacity what-if method against simulator re-runs, per workload shape.

For each shape of `kvscope.simulator.whatif_check.SHAPES` at caches of 50/70/90% of its
working set (and issue 15's held-back workload), predict the fleet hit rate at +25/+50/+100%
capacity with each method and re-run the simulator at that size. Prints a Markdown table
(worst |error| in points per method and shape, and each method's worst overall) for
docs/analytics.md. Not a timing benchmark: the numbers do not depend on machine load.

    python bench/whatif_errors.py
"""

from __future__ import annotations

import argparse
import datetime as dt

from kvscope.simulator.whatif_check import HELD_BACK, METHODS, SHAPES, SHARES, measure, sized


def main() -> None:
    """Measure and print the table."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    cases = [(f"{name} @ {share:.0%}", sized(name, share)) for name in SHAPES for share in SHARES]
    cases.append(("held-back (5 × 160 blocks, 3000 req)", HELD_BACK))
    worst = dict.fromkeys(METHODS, (0.0, ""))
    print(f"Measured {dt.date.today()}; error = prediction − re-run, worst of +25/+50/+100 %.\n")
    print(
        "| shape @ cache / working set | capacity | hit rate | replay routing | "
        + " | ".join(METHODS)
        + " |"
    )
    print("|---|---:|---:|---|" + "---:|" * len(METHODS))
    for label, config in cases:
        check = measure(config)
        cells = []
        for m in METHODS:
            w = check.worst_pp(m)
            cells.append(f"{w:.2f}")
            if w > worst[m][0]:
                worst[m] = (w, label)
        routing = "re-routed" if check.method.endswith("rerouted") else "fixed"
        print(
            f"| {label} | {config.capacity_blocks} | {check.hit_rate:.3f} | {routing} | "
            + " | ".join(cells)
            + " |"
        )
    print()
    for m, (w, label) in worst.items():
        print(f"- {m}: worst {w:.2f} pp ({label})")


if __name__ == "__main__":
    main()
