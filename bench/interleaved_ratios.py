"""One column of bench_numba's interleaved tables, read from its JSON (--out):
a line of the values by size, for scripts that summarise a run.

    python3 bench/interleaved_ratios.py bench_numba.json device_array cuemm/floor [--with-sizes]
"""
import argparse
import json
import sys

from bench_numba import interleaved_summary  # (a script's own folder is on sys.path)

KINDS = {"device_array": "interleaved", "pinned_array": "interleaved-pinned", "mapped_array": "interleaved-mapped"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("call", choices=sorted(KINDS))
    parser.add_argument("column", help="cuemm/floor, default/cuemm or default/floor")
    parser.add_argument("--with-sizes", action="store_true", help="print SIZE VALUE pairs")
    args = parser.parse_args()
    with open(args.json) as source:
        figures = json.load(source)
    kind = KINDS[args.call]
    if kind not in figures:
        sys.exit(f"{args.json}: no interleaved {args.call} measurement")
    rows = interleaved_summary(figures[kind])
    if any(args.column not in row for row in rows.values()):
        sys.exit(f"no column {args.column!r}; there are: {', '.join(next(iter(rows.values())))}")
    speedup = args.column.startswith("default/")  # printed as 3.5x; cuemm/floor as 1.008
    cells = []
    for size, row in sorted(rows.items()):
        value = f"{row[args.column]:.1f}x" if speedup else f"{row[args.column]:.3f}"
        cells.append(f"{size} {value}" if args.with_sizes else value)
    print("  ".join(cells) if args.with_sizes else " ".join(cells))


if __name__ == "__main__":
    main()
