"""The TAP-style lines every Python test prints: "ok - name" or "not ok -
name" with up to 15 "#   " lines of why; tests/run.sh counts them. No
dependencies, so any interpreter (the oracles' venv, the wheel's) can use it."""

import sys

_fails = 0


def report(ok, name, why=""):
    """Prints "ok - name" or "not ok - name" and up to 15 lines of why."""
    global _fails
    print(("ok - " if ok else "not ok - ") + name)
    if not ok:
        _fails += 1
        for line in str(why).strip().splitlines()[:15]:
            print("#   " + line)
    sys.stdout.flush()


def fails():
    """How many reports so far were not ok."""
    return _fails
