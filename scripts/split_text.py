#!/usr/bin/env python3
"""Split a text file in two at the line boundary nearest its middle byte.

Used for stories260K: calibration on the first half of tinystories_val.txt, evaluation on the
second half. A "line boundary" is the position just after a '\n'; the first half ends with it.
"""
import argparse
import os
import sys


def split_point(data: bytes) -> int:
    middle = len(data) // 2
    before = data.rfind(b"\n", 0, middle)
    after = data.find(b"\n", middle)
    candidates = [p + 1 for p in (before, after) if p != -1]
    if not candidates:
        sys.exit(f"split_text: {len(data)} bytes without a newline: cannot split at a line boundary")
    return min(candidates, key=lambda p: (abs(p - middle), p))


def atomic_write(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("input")
    parser.add_argument("first_half")
    parser.add_argument("second_half")
    args = parser.parse_args()
    with open(args.input, "rb") as f:
        data = f.read()
    cut = split_point(data)
    atomic_write(args.first_half, data[:cut])
    atomic_write(args.second_half, data[cut:])
    print(f"split {args.input} at byte {cut} of {len(data)}")


if __name__ == "__main__":
    main()
