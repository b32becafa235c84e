"""python -m atgrpo_jax.data prepare NAME [NAME ...] [--out=DIR] [--revision=REV] [--limit=N]
python -m atgrpo_jax.data list

`prepare` downloads the paper's data sets from the Hugging Face hub (or reads them from its cache;
HF_HUB_OFFLINE=1 reads only the cache) and writes DIR/NAME.jsonl. DIR defaults to $ATGRPO_DATA, else
./data: where the paper configs look for them."""
from __future__ import annotations

import argparse
import sys

from atgrpo_jax.data.paper_sets import PAPER_SETS
from atgrpo_jax.data.prepare import prepare
from atgrpo_jax.data.readers import DataError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atgrpo_jax.data", description=__doc__.split("\n\n")[1])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="download and convert data sets")
    prep.add_argument("names", nargs="+", metavar="NAME", help=", ".join(PAPER_SETS))
    prep.add_argument("--out", default="", help="output directory (default $ATGRPO_DATA, else ./data)")
    prep.add_argument("--revision", default=None, help="hub revision (branch, tag or commit)")
    prep.add_argument("--limit", type=int, default=None, help="keep only the first N records")
    sub.add_parser("list", help="the data sets prepare knows")
    args = parser.parse_args(argv)
    if args.command == "list":
        for spec in PAPER_SETS.values():
            print(f"{spec.name:20s} {spec.task:5s} hf:{spec.repo}  {spec.about} [{spec.license}]")
        return 0

    for name in args.names:
        try:
            path, count = prepare(name, args.out, args.revision, args.limit)
        except DataError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{name}: {count} records -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
