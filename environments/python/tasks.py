"""Generated tasks for the python environment: math and string problems with exact answers.

Every generator draws from a numpy ``Generator`` (so a seed fixes the task) and returns a
:class:`Task`: the question, the exact answer as a string, and a reference solution in Python
(the oracle runs it in the sandbox). Answers are computed here, on the host, from the task's
parameters: never by running code.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["GENERATORS", "Task", "generate"]

_WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "maple",
    "quiet",
    "orbit",
    "lemon",
    "candle",
    "forest",
    "pixel",
    "violet",
    "harbor",
    "ember",
    "sailor",
    "meadow",
    "copper",
]


@dataclass(frozen=True)
class Task:
    kind: str
    question: str
    answer: str
    solution: str
    """Python that prints the answer (the oracle's tool call)."""


def _sum_of_squares(rng: np.random.Generator) -> Task:
    a = int(rng.integers(1, 200))
    b = a + int(rng.integers(50, 2000))
    ans = sum(i * i for i in range(a, b + 1))
    return Task(
        "math",
        f"What is the sum of the squares of the integers from {a} to {b} inclusive?",
        str(ans),
        f"print(sum(i * i for i in range({a}, {b} + 1)))",
    )


def _count_primes(rng: np.random.Generator) -> Task:
    n = int(rng.integers(1000, 50000))
    sieve = bytearray([1]) * n
    sieve[0:2] = b"\x00\x00"
    for i in range(2, math.isqrt(n - 1) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(range(i * i, n, i)))
    ans = sum(sieve)
    code = (
        f"n = {n}\ns = bytearray([1]) * n\ns[0:2] = b'\\x00\\x00'\n"
        "for i in range(2, int(n ** 0.5) + 1):\n    if s[i]:\n        s[i*i::i] = bytearray(len(range(i*i, n, i)))\n"
        "print(sum(s))"
    )
    return Task("math", f"How many prime numbers are smaller than {n}?", str(ans), code)


def _fibonacci_mod(rng: np.random.Generator) -> Task:
    k = int(rng.integers(100, 5000))
    m = int(rng.integers(1000, 10**6))
    a, b = 0, 1
    for _ in range(k):
        a, b = b, a + b
    return Task(
        "math",
        f"What is the {k}-th Fibonacci number modulo {m}? (F(0) = 0, F(1) = 1)",
        str(a % m),
        f"a, b = 0, 1\nfor _ in range({k}):\n    a, b = b, a + b\nprint(a % {m})",
    )


def _digit_sum_factorial(rng: np.random.Generator) -> Task:
    n = int(rng.integers(20, 400))
    ans = sum(int(d) for d in str(math.factorial(n)))
    return Task(
        "math",
        f"What is the sum of the decimal digits of {n}! ({n} factorial)?",
        str(ans),
        f"import math\nprint(sum(int(d) for d in str(math.factorial({n}))))",
    )


def _lcm_range(rng: np.random.Generator) -> Task:
    a = int(rng.integers(2, 15))
    b = a + int(rng.integers(5, 25))
    ans = math.lcm(*range(a, b + 1))
    return Task(
        "math",
        f"What is the least common multiple of all integers from {a} to {b} inclusive?",
        str(ans),
        f"import math\nprint(math.lcm(*range({a}, {b} + 1)))",
    )


def _divisor_count(rng: np.random.Generator) -> Task:
    n = int(rng.integers(10**5, 10**7))
    ans = sum(2 - (d * d == n) for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return Task(
        "math",
        f"How many positive divisors does {n} have?",
        str(ans),
        f"import math\nn = {n}\nprint(sum(2 - (d * d == n) for d in range(1, math.isqrt(n) + 1) if n % d == 0))",
    )


def _sentence(rng: np.random.Generator, lo: int = 4, hi: int = 9) -> list[str]:
    return [_WORDS[int(i)] for i in rng.integers(0, len(_WORDS), int(rng.integers(lo, hi)))]


def _reverse_words(rng: np.random.Generator) -> Task:
    s = " ".join(_sentence(rng))
    return Task(
        "string",
        f"Reverse the order of the words in {s!r} (words are separated by single spaces).",
        " ".join(reversed(s.split())),
        f"print(' '.join(reversed({s!r}.split())))",
    )


def _count_vowels(rng: np.random.Generator) -> Task:
    s = "".join(_sentence(rng, 6, 14))
    ans = sum(c in "aeiou" for c in s)
    return Task(
        "string",
        f"How many vowels (a, e, i, o, u) are in the string {s!r}?",
        str(ans),
        f"print(sum(c in 'aeiou' for c in {s!r}))",
    )


def _caesar(rng: np.random.Generator) -> Task:
    s = " ".join(_sentence(rng, 2, 5))
    k = int(rng.integers(1, 26))
    ans = "".join(chr((ord(c) - 97 + k) % 26 + 97) if c.isalpha() else c for c in s)
    return Task(
        "string",
        f"Shift every letter of {s!r} forward by {k} places in the alphabet (z wraps to a; "
        "spaces stay). What is the result?",
        ans,
        f"print(''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if c.isalpha() else c for c in {s!r}))",
    )


def _run_length(rng: np.random.Generator) -> Task:
    s = "".join("abc"[int(rng.integers(3))] * int(rng.integers(1, 6)) for _ in range(int(rng.integers(4, 9))))
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        out.append(f"{s[i]}{j - i}")
        i = j
    code = f"import itertools\nprint(''.join(f'{{k}}{{len(list(g))}}' for k, g in itertools.groupby({s!r})))"
    return Task(
        "string",
        f"Run-length encode {s!r} as letter-count pairs (e.g. 'aaab' -> 'a3b1').",
        "".join(out),
        code,
    )


def _most_common_letter(rng: np.random.Generator) -> Task:
    s = "".join(_sentence(rng, 5, 10))
    counts = Counter(s)
    best = max(counts.values())
    ans = min(c for c, n in counts.items() if n == best)
    return Task(
        "string",
        f"Which letter occurs most often in {s!r}? If several tie, give the alphabetically first.",
        ans,
        f"from collections import Counter\nc = Counter({s!r})\nm = max(c.values())\n"
        "print(min(k for k, v in c.items() if v == m))",
    )


def _sorted_unique_letters(rng: np.random.Generator) -> Task:
    s = "".join(_sentence(rng, 3, 7))
    return Task(
        "string",
        f"List the distinct letters of {s!r} in alphabetical order, as one string.",
        "".join(sorted(set(s))),
        f"print(''.join(sorted(set({s!r}))))",
    )


GENERATORS: dict[str, tuple[Callable[[np.random.Generator], Task], ...]] = {
    "math": (
        _sum_of_squares,
        _count_primes,
        _fibonacci_mod,
        _digit_sum_factorial,
        _lcm_range,
        _divisor_count,
    ),
    "string": (
        _reverse_words,
        _count_vowels,
        _caesar,
        _run_length,
        _most_common_letter,
        _sorted_unique_letters,
    ),
}


def generate(rng: np.random.Generator, kinds: tuple[str, ...] = ("math", "string")) -> Task:
    kind = kinds[int(rng.integers(len(kinds)))]
    gens = GENERATORS[kind]
    return gens[int(rng.integers(len(gens)))](rng)
