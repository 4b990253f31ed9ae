"""One line for a memcheck run that passed: its tests' result and its leak records by kind.

    python3 .ci/valgrind_summary.py NAME VALGRIND_LOG TEST_OUTPUT

The leak records of a passing run are expected (see `.ci/run`), so they are counted rather than
printed; the log keeps them. Exits 1 when the log holds an error summary with errors, which a
passing run cannot have.
"""

import re
import sys
from collections import Counter

RECORD = re.compile(r"([\d,]+) bytes in ([\d,]+) blocks are (definitely|indirectly|possibly) lost")
ERRORS = re.compile(r"ERROR SUMMARY: ([\d,]+) errors")


def summarise(name, log, out, log_path):
    records, blocks = Counter(), Counter()
    for line in log.splitlines():
        m = RECORD.search(line)
        if m:
            records[m[3]] += 1
            blocks[m[3]] += int(m[2].replace(",", ""))
        m = ERRORS.search(line)
        if m and m[1] != "0":
            return None
    results = [l.strip() for l in out.splitlines() if l.startswith("test result:")]
    leaks = ", ".join(
        f"{records[k]} {k} lost ({blocks[k]} blocks)"
        for k in ("definitely", "indirectly", "possibly")
        if records[k]
    )
    return (
        f"valgrind {name}: no memory errors; "
        f"{'; '.join(results) or 'no test result line'}; "
        f"expected leak records: {leaks or 'none'} (full log: {log_path})"
    )


def main():
    name, log_path, out_path = sys.argv[1:4]
    with open(log_path) as f:
        log = f.read()
    with open(out_path) as f:
        out = f.read()
    line = summarise(name, log, out, log_path)
    if line is None:
        print(log)
        print(f"ci: valgrind: {name}: errors in {log_path}")
        sys.exit(1)
    print(line)


if __name__ == "__main__":
    main()
