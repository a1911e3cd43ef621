"""Per-file mutation score from mutmut's results, with the survivors classified by hand.

    python benchmarks/mutation_report.py [--classes docs/mutation_survivors.tsv] [--prefix selfsup.methods.]

Reads ``mutmut results --all true`` (run ``make mutation`` first) and a tab-separated file of
``<mutant id> <TAB> <class> <TAB> <reason>`` rows for the survivors (class: equivalent, device or message; or killed:
a mutant that mutmut could not judge, killed when its tests were run directly under ``MUTANT_UNDER_TEST``), and prints
a markdown table (mutants, killed, timed out, survived, each class, killed / all, killed / non-equivalent) and the
survivors that have no class yet. Timed-out mutants count as killed (mutmut's rule) unless the file classifies them
(a time-out that survived when its tests were run directly); ``device`` and ``equivalent`` mutants are left out of
the non-equivalent denominator, ``message`` mutants are not.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
from pathlib import Path

CLASSES = ("equivalent", "device", "message", "killed")
LINE = re.compile(r"^\s*(?P<mutant>(?P<module>selfsup\.\S+?)\.x[_ǁ]\S+?__mutmut_\d+): (?P<status>.+)$")


def results() -> list[tuple[str, str, str]]:
    """(mutant id, file, status) for every mutant mutmut knows."""
    out = subprocess.run([str(Path(sys.executable).with_name("mutmut")), "results", "--all", "true"],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        match = LINE.match(line)
        if match:  # selfsup.methods.nnclr.xǁNNCLRǁforward__mutmut_3, selfsup.methods.x_method_config__mutmut_6
            module = match["module"].replace(".", "/")
            path = module + ".py" if Path(module + ".py").is_file() else module + "/__init__.py"
            rows.append((match["mutant"], path, match["status"].strip()))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=Path, default=Path("docs/mutation_survivors.tsv"))
    parser.add_argument("--prefix", default="selfsup.", help="only mutants whose id starts so")
    args = parser.parse_args()
    classes = {}
    if args.classes.is_file():
        for line in args.classes.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                mutant, cls, _reason = line.split("\t", 2)
                if cls not in CLASSES:
                    raise SystemExit(f"{args.classes}: unknown class {cls!r} for {mutant}; use one of {CLASSES}")
                classes[mutant] = cls
    table: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    unclassified = []
    for mutant, path, status in results():
        if not mutant.startswith(args.prefix):
            continue
        row = table[path]
        row["mutants"] += 1
        if status == "killed":
            row["killed"] += 1
        elif status in ("survived", "timeout") and mutant in classes:  # a time-out found to survive when re-run
            row[classes[mutant]] += 1
        elif status == "timeout":
            row["timeout"] += 1
        elif status == "survived":
            row["survived"] += 1
            unclassified.append(mutant)
        else:
            row["other: " + status] += 1
            unclassified.append(f"{mutant} ({status})")
    total = sum(table.values(), collections.Counter())
    print("| file | mutants | killed | timed out | survived | equivalent | device | message | killed / all "
          "| killed / non-equivalent |\n|---|---|---|---|---|---|---|---|---|---|")
    for name, row in [(f"`{path}`", table[path]) for path in sorted(table)] + [("**all of these**", total)]:
        killed = row["killed"] + row["timeout"]
        relevant = row["mutants"] - row["equivalent"] - row["device"]
        print(f"| {name} | {row['mutants']} | {row['killed']} | {row['timeout']} "
              f"| {row['survived']} | {row['equivalent']} | {row['device']} | {row['message']} "
              f"| {100 * killed / max(row['mutants'], 1):.1f} % | {100 * killed / max(relevant, 1):.1f} % |")
    if unclassified:
        print(f"\n{len(unclassified)} survivors without a class:\n" + "\n".join(unclassified))


if __name__ == "__main__":
    main()
