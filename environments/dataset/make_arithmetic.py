"""Write the arithmetic word problems of the dataset demo (environments/dataset/arithmetic.jsonl), offline.

Each row is {"question": ..., "answer": "<integer>", "solution": "<a>+<b>" or "<a>-<b>"}: two
quantities (1-9) added or taken away in one of five stories. The file is deterministic (a fixed
seed), so the shipped copy and `python environments/dataset/make_arithmetic.py` agree;
`--rows N --out PATH` writes another one.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = ["Ann", "Ben", "Cal", "Dee", "Eva", "Finn", "Gus", "Hana", "Ivy", "Jon"]
THINGS = ["apples", "pens", "cards", "coins", "books", "cups", "stamps", "shells"]
ADD = [
    "{n} has {a} {t}. {n} gets {b} more. How many {t} does {n} have now?",
    "{n} had {a} {t} and found {b} more. How many {t} does {n} have?",
    "There are {a} {t} in a box and {n} puts in {b} more. How many {t} are in the box?",
]
SUB = [
    "{n} has {a} {t} and gives away {b}. How many {t} are left?",
    "{n} had {a} {t} and lost {b}. How many {t} does {n} have now?",
]


def make(rows: int, seed: int = 0, max_number: int = 9, subtract: float = 0.5) -> list[dict[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        n, t = rng.choice(NAMES), rng.choice(THINGS)
        a, b = rng.randint(1, max_number), rng.randint(1, max_number)
        if rng.random() >= subtract or a == b:
            question, answer, solution = rng.choice(ADD).format(n=n, t=t, a=a, b=b), a + b, f"{a}+{b}"
        else:
            a, b = max(a, b), min(a, b)
            question, answer, solution = rng.choice(SUB).format(n=n, t=t, a=a, b=b), a - b, f"{a}-{b}"
        out.append({"question": question, "answer": str(answer), "solution": solution})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-number", type=int, default=9)
    parser.add_argument("--subtract", type=float, default=0.5, help="share of take-away problems")
    parser.add_argument("--out", default=str(Path(__file__).with_name("arithmetic.jsonl")))
    args = parser.parse_args()
    rows = make(args.rows, args.seed, args.max_number, args.subtract)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
