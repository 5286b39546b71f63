"""Keeps what every `tpshard ... --json` run of the Python tests printed.

With TPS_JSON_DIR set (tests/run.sh sets it), save() writes the standard
output of a run whose arguments include --json into that directory, beside
its arguments (NAME.args, one a line) and exit status (NAME.rc), as the CLI
tests' `tps` does; tests/py/check_json_docs.py validates them all against
docs/schema at the end of `make test`.
"""
import os
import sys
import tempfile


def save(args, proc):
    """args: the arguments after the binary; proc: its CompletedProcess (text)."""
    d = os.environ.get("TPS_JSON_DIR")
    args = [str(a) for a in args]
    if not d or "--json" not in args:
        return
    os.makedirs(d, exist_ok=True)
    test = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    fd, path = tempfile.mkstemp(dir=d, prefix=test + ".")
    with os.fdopen(fd, "w") as f:
        f.write(proc.stdout or "")
    with open(path + ".args", "w") as f:
        f.write("".join(a + "\n" for a in args))
    with open(path + ".rc", "w") as f:
        f.write(f"{proc.returncode}\n")
