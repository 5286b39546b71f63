"""Runs the `run:` steps of a GitHub Actions workflow file as written, in order,
on this machine, as a runner would: the workflow's, job's and step's env
(expressions over vars, env, github and runner evaluated), bash with
-eo pipefail, GITHUB_ENV / GITHUB_OUTPUT / GITHUB_STEP_SUMMARY files, later
steps skipped after a failure unless their `if:` says always() or failure().
`uses:` steps are not run: for actions/upload-artifact the paths it would
upload are resolved and must exist (if-no-files-found: error).

  gha.py WORKFLOW JOB WORKSPACE [--skip ID,...] [--var NAME=VALUE ...]

WORKSPACE is the working directory (what actions/checkout makes); --skip
names steps (by id) not to run; --var sets a repository variable (vars.NAME).
Prints each step's name and output; exits 0 when every step run succeeded,
else 1 after a line "step ID failed (exit N)". Needs PyYAML.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def evaluate(expr, ctx):
    """The expressions this repository's workflows use: a || b || 'literal',
    vars.X, env.X, github.workspace, runner.temp, runner.os, success(),
    always(), failure(), !cond."""
    expr = expr.strip()
    if expr.startswith("!"):
        return not evaluate(expr[1:], ctx)
    if "||" in expr:
        for part in expr.split("||"):
            v = evaluate(part, ctx)
            if v:
                return v
        return v
    if expr.startswith("'") and expr.endswith("'"):
        return expr[1:-1].replace("''", "'")
    if expr in ("success()", "always()", "failure()", "cancelled()"):
        return {"success()": not ctx["failed"], "always()": True, "failure()": ctx["failed"],
                "cancelled()": False}[expr]
    m = re.fullmatch(r"(vars|env|github|runner)\.([A-Za-z_][A-Za-z0-9_]*)", expr)
    if not m:
        raise SystemExit(f"gha.py: unsupported expression: ${{{{ {expr} }}}}")
    scope, name = m.groups()
    return ctx[scope].get(name, "")


def substitute(text, ctx):
    return EXPR.sub(lambda m: str(evaluate(m.group(1), ctx)), str(text))


def condition(cond, ctx):
    if cond is None:
        return not ctx["failed"]
    cond = str(cond).strip()
    m = EXPR.fullmatch(cond)
    v = evaluate(m.group(1) if m else cond, ctx)
    # a status check function anywhere in it decides; else success() is implied
    if not re.search(r"(always|failure|cancelled|success)\(\)", cond) and ctx["failed"]:
        return False
    return bool(v)


def read_env_file(path):
    out = {}
    lines = open(path).read().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and "=" not in line.split("<<")[0]:
            name, delim = line.split("<<", 1)
            val = []
            i += 1
            while i < len(lines) and lines[i] != delim:
                val.append(lines[i])
                i += 1
            out[name] = "\n".join(val)
        elif "=" in line:
            name, val = line.split("=", 1)
            out[name] = val
        i += 1
    return out


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    wf_path, job_id, ws = argv[0], argv[1], os.path.abspath(argv[2])
    skip, variables = set(), {}
    i = 3
    while i < len(argv):
        if argv[i] == "--skip":
            skip |= set(argv[i + 1].split(","))
            i += 2
        elif argv[i] == "--var":
            k, v = argv[i + 1].split("=", 1)
            variables[k] = v
            i += 2
        else:
            raise SystemExit(f"gha.py: unknown argument {argv[i]}")
    wf = yaml.safe_load(open(wf_path))
    job = wf["jobs"][job_id]
    tmp = tempfile.mkdtemp(prefix="gha.", dir=os.environ.get("TPS_TMP") or None)
    files = {k: os.path.join(tmp, k.lower()) for k in ("GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")}
    for f in files.values():
        open(f, "w").close()
    runner = {"temp": os.path.join(tmp, "runner-temp"), "os": "Linux"}
    os.makedirs(runner["temp"])
    ctx = {"vars": variables, "github": {"workspace": ws}, "runner": runner, "env": {}, "failed": False}
    for scope in (wf.get("env") or {}), (job.get("env") or {}):
        for k, v in scope.items():
            ctx["env"][k] = substitute(v, ctx)
    shell = ((job.get("defaults") or {}).get("run") or {}).get("shell", "bash")
    if shell != "bash":
        raise SystemExit(f"gha.py: only bash steps are run here, not {shell}")
    status = 0
    for n, step in enumerate(job["steps"]):
        sid = step.get("id") or f"step{n}"
        name = step.get("name") or step.get("uses") or sid
        if sid in skip:
            print(f"## {name} ({sid}): skipped here")
            continue
        senv = {k: substitute(v, ctx) for k, v in (step.get("env") or {}).items()}
        if not condition(step.get("if"), {**ctx, "env": {**ctx["env"], **senv}}):
            print(f"## {name} ({sid}): not run (if: {step.get('if', 'success()')})")
            continue
        if "uses" in step:
            if step["uses"].startswith("actions/upload-artifact@"):
                w = step.get("with") or {}
                paths = [substitute(p, ctx).strip() for p in str(w.get("path", "")).splitlines() if p.strip()]
                there = [p for p in paths if os.path.exists(os.path.join(ws, p))]
                print(f"## {name} ({sid}): would upload {substitute(w.get('name', 'artifact'), ctx)}: "
                      + ", ".join(paths))
                if w.get("if-no-files-found", "warn") == "error" and len(there) != len(paths):
                    print(f"step {sid} failed: nothing at {', '.join(set(paths) - set(there))}")
                    ctx["failed"], status = True, 1
            else:
                print(f"## {name} ({sid}): {step['uses']} not run here")
            continue
        script = os.path.join(tmp, f"{sid}.sh")
        with open(script, "w") as f:
            f.write(step["run"])
        env = {**os.environ, **ctx["env"], **senv, "CI": "true", "GITHUB_ACTIONS": "true",
               "GITHUB_WORKSPACE": ws, "RUNNER_TEMP": runner["temp"], "RUNNER_OS": "Linux", **files}
        print(f"## {name} ({sid})", flush=True)
        rc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", script], cwd=ws,
                            env=env).returncode
        # what the step added to GITHUB_ENV holds for the steps after it
        ctx["env"].update(read_env_file(files["GITHUB_ENV"]))
        if rc != 0:
            print(f"step {sid} failed (exit {rc})", flush=True)
            ctx["failed"], status = True, 1
    shutil.rmtree(tmp, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
