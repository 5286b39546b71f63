"""The `tpshard` command of the wheel: runs the tpshard program shipped in
this package in place of this process (same program, same exit status and
signals; only its location differs from a source build's)."""
import os
import sys

from ._lib import EXECUTABLE


def main() -> None:
    try:
        os.execv(EXECUTABLE, ["tpshard", *sys.argv[1:]])
    except OSError as e:
        sys.stderr.write(f"tpshard: error: cannot run {EXECUTABLE}: {e.strerror}\n")
        sys.exit(126)
