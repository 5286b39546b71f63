"""Validates every --json document the test suite produced against docs/schema.

The CLI tests' `tps` and the Python tests' runner keep the standard output of
every `tpshard ... --json` run in TPS_JSON_DIR (NAME: the output, NAME.args:
the arguments, one a line, NAME.rc: the exit status). tests/run.sh runs this
last, with the venv's Python (jsonschema). It prints one ok / not ok line per
document kind, so a change every document shares (a field every document
lacks) reads as one line per kind, not hundreds:

  - the schemas are valid JSON Schema (draft 2020-12);
  - every document of a kind validates against its schema, strictly: the
    published schemas accept properties they do not list (consumers keep
    working when a later 1.x adds fields), the test adds
    "additionalProperties": false to every object that lists its properties,
    so an undocumented field fails here until the schema documents it;
  - each run printed exactly one document, and its exit status agrees with it;
  - the suite produced every kind, and the variants the schemas describe;
  - renaming any field of any document makes it invalid (every field path
    seen, in the first document that has it).

Usage: check_json_docs.py DIR   (env TOP: the repository root)
"""
import copy
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import fails, report  # noqa: E402

try:
    import jsonschema
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012
except ImportError as e:  # run.sh runs this with the venv's Python
    print(f"not ok - json schema: cannot import jsonschema ({e}); run with build/venv/bin/python")
    sys.exit(1)

TOP = os.environ.get("TOP") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMAS = os.path.join(TOP, "docs", "schema")
COMMANDS = ("inspect", "plan", "split", "check", "merge", "verify")
# Document kinds: schema file, and the command that prints it.
KINDS = {
    "inspect": "inspect.schema.json",
    "plan": "plan.schema.json",
    "plan-list": "plan-list.schema.json",
    "split": "split.schema.json",
    "check": "check.schema.json",
    "merge": "merge.schema.json",
    "verify": "verify.schema.json",
}
# Objects whose keys are data, not fields: renaming one is a different
# document, not a renamed field. (Paths with array indices as "[]".)
DATA_MAPS = {"dtypes", "summary.kinds"}
# Values that are config.json's own, whatever their shape.
OPAQUE = ("config.",)


def strict(node, under_if=False):
    """A copy of a schema where every object schema that lists its properties
    and says nothing about others allows no others. Conditions (if) are left
    as they are: they test documents, they do not describe them."""
    if isinstance(node, list):
        return [strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "if":
            out[k] = v
        elif k in ("properties", "$defs", "patternProperties"):
            out[k] = {n: strict(s) for n, s in v.items()}
        else:
            out[k] = strict(v)
    t = node.get("type")
    is_obj = t == "object" or (isinstance(t, list) and "object" in t)
    if is_obj and "properties" in node and "additionalProperties" not in node and \
            "unevaluatedProperties" not in node and "patternProperties" not in node:
        out["additionalProperties"] = False
    return out


def load_schemas():
    files = sorted(glob.glob(os.path.join(SCHEMAS, "*.schema.json")))
    raw, bad = {}, []
    for f in files:
        name = os.path.basename(f)
        try:
            raw[name] = json.load(open(f))
            jsonschema.Draft202012Validator.check_schema(raw[name])
        except Exception as e:  # noqa: BLE001 - report any way a schema is broken
            bad.append(f"{name}: {str(e).splitlines()[0]}")
    missing = [k for k in list(KINDS.values()) + ["error.schema.json", "common.schema.json"] if k not in raw]
    report(not bad and not missing,
           f"json schema: the {len(raw)} schemas in docs/schema are valid JSON Schema (draft 2020-12)",
           "\n".join(bad + [f"missing {m}" for m in missing]))
    if bad or missing:
        return None

    def validators(transform):
        # Resources under their file names: "$ref": "error.schema.json" finds them.
        reg = Registry().with_resources((n, DRAFT202012.create_resource(transform(s))) for n, s in raw.items())
        return {k: jsonschema.Draft202012Validator(transform(raw[f]), registry=reg) for k, f in KINDS.items()}

    return validators(strict), validators(lambda s: s)


def kind_of(args):
    """The document kind a command line prints, or None when it prints none."""
    cmd = next((a for a in args if a in COMMANDS), None)
    if cmd == "plan" and "--list" in args:
        return "plan-list"
    if cmd == "split" and "--dry-run" in args:
        return "plan"
    return cmd


def load_docs(d):
    docs, problems = [], []
    for out in sorted(glob.glob(os.path.join(d, "*"))):
        if out.endswith((".args", ".rc")) or not os.path.exists(out + ".args"):
            continue
        args = open(out + ".args").read().splitlines()
        rc = int((open(out + ".rc").read().strip() or "-1") if os.path.exists(out + ".rc") else -1)
        text = open(out).read()
        where = f"{os.path.basename(out).split('.')[0]}: tpshard {' '.join(args)}"
        kind = kind_of(args)
        if kind is None:
            problems.append(f"{where}: not a command that prints a document")
            continue
        if not text.strip():
            if rc != 2:  # usage errors print no document
                problems.append(f"{where}: exit {rc} and no document on stdout")
            continue
        if text.count("\n") != 1 or not text.endswith("\n"):
            problems.append(f"{where}: printed {text.count(chr(10))} lines, not one document")
            continue
        try:
            doc = json.loads(text)
        except ValueError as e:
            problems.append(f"{where}: not JSON: {e}")
            continue
        docs.append({"kind": kind, "args": args, "rc": rc, "doc": doc, "where": where,
                     "error": isinstance(doc, dict) and doc.get("ok") is False and "error" in doc})
    return docs, problems


def first_error(v, doc):
    e = jsonschema.exceptions.best_match(v.iter_errors(doc))
    if e is None:
        return None
    path = ".".join(str(p) for p in e.absolute_path) or "(document)"
    return f"{path}: {e.message[:300]}"


def validate(docs, strict_v):
    groups = {k: [] for k in list(KINDS) + ["error"]}
    for d in docs:
        groups["error" if d["error"] else d["kind"]].append(d)
    for g, items in groups.items():
        bad = []  # (document, its first error, whether schema_version is all it lacks)
        for d in items:
            err = first_error(strict_v[d["kind"]], d["doc"])
            if err:
                fixed, added = with_version(d["doc"])
                bad.append((d, first_error(strict_v[d["kind"]], fixed) if added else err, added))
        schema = "error.schema.json" if g == "error" else KINDS[g]
        what = f"{len(items)} {g} document{'s' if len(items) != 1 else ''}"
        if not items:
            report(False, f"json schema: no {g} document was produced by the tests")
        elif not bad:
            report(True, f"json schema: {what} validate{'s' if len(items) == 1 else ''} against docs/schema/{schema}")
        elif all(added and e is None for _, e, added in bad):
            report(False, f"json schema: {len(bad)} of {what} lack{'s' if len(items) == 1 else ''} schema_version "
                          f"(docs/schema/{schema} requires it), and nothing else")
        else:
            d, e, _ = next((b for b in bad if b[1] is not None), bad[0])
            report(False, f"json schema: {len(bad)} of {what} fail docs/schema/{schema}",
                   f"first: {d['where']}\n{e}")


def exit_status_agrees(d):
    doc, rc, kind = d["doc"], d["rc"], d["kind"]
    if not isinstance(doc, dict):
        return False
    if d["error"]:
        # verify of a partial directory: the error document, exit 3 as check's
        partial = kind == "verify" and ": partial: " in str(doc.get("error"))
        return rc in ((3,) if partial else (1, 130))
    if kind == "check":
        return rc == (0 if doc.get("missing_ranks") == "" else 3)
    if kind in ("plan", "verify"):
        return rc == (0 if doc.get("ok") else 1)
    return rc == 0


def coverage(docs):
    """The variants each schema describes, each seen at least once."""
    def has(kind, pred, error=False):
        return any(d["kind"] == kind and d["error"] == error and pred(d["doc"]) for d in docs)
    want = {
        "inspect of a quantized checkpoint": has("inspect", lambda x: x.get("quantization")),
        "inspect of a quantization tpshard refuses": has("inspect", lambda x: (x.get("quantization") or {}).get("supported") is False),
        "inspect without config.json": has("inspect", lambda x: x.get("config") is None),
        "inspect of a tpshard output": has("inspect", lambda x: x.get("kind") == "tpshard output"),
        "plan accepted": has("plan", lambda x: x.get("ok") is True),
        "plan rejected": has("plan", lambda x: x.get("ok") is False),
        "plan with a serving layout (rank_tensors)": has("plan", lambda x: "rank_tensors" in x),
        "plan of a quantized checkpoint": has("plan", lambda x: x.get("quantization")),
        "plan with --untie": has("plan", lambda x: x.get("untie")),
        "split --dry-run": any(d["kind"] == "plan" and "split" in d["args"] for d in docs),
        "plan --list": has("plan-list", lambda x: True),
        "split": has("split", lambda x: x.get("ranks_written", 0) > 0),
        "split --ranks auto with no rank to write": has("split", lambda x: x.get("ranks_written") == 0),
        "check of a complete directory": has("check", lambda x: x.get("missing_ranks") == ""),
        "check of a partial directory": has("check", lambda x: x.get("missing_ranks")),
        "merge": has("merge", lambda x: True),
        "verify passing with --source": has("verify", lambda x: x.get("ok") and x.get("source")),
        "verify without --source": has("verify", lambda x: x.get("source") is None),
        "verify failing": has("verify", lambda x: x.get("ok") is False),
    }
    for c in COMMANDS:
        want[f"{c} error document"] = any(d["kind"] == c and d["error"] for d in docs)
    missing = [k for k, v in want.items() if not v]
    report(not missing, f"json schema: the tests produced every kind and variant of document ({len(want)})",
           "missing: " + "; ".join(missing))


def paths(node, prefix=""):
    """(path, parent path, key) of every object member, array indices as []."""
    if isinstance(node, dict):
        for k, v in node.items():
            p = f"{prefix}.{k}" if prefix else k
            yield p, prefix, k
            if not p.startswith(OPAQUE):
                yield from paths(v, p)
    elif isinstance(node, list):
        for v in node:
            yield from paths(v, prefix + "[]")


def renamed(doc, path):
    """A copy of doc with the member at path (first occurrence) renamed."""
    out = copy.deepcopy(doc)
    parts = path.split(".")

    def walk(node, i):
        if isinstance(node, list):
            return any(walk(x, i) for x in node)
        if not isinstance(node, dict):
            return False
        name = parts[i].replace("[]", "")
        if name not in node:
            return False
        if i == len(parts) - 1:
            items = [(k + "_renamed" if k == name else k, v) for k, v in node.items()]
            node.clear()
            node.update(items)
            return True
        return walk(node[name], i + 1)
    return out if walk(out, 0) else None


def with_version(doc):
    """The document as the contract has it: schema_version after ok, added
    when the binary does not print it (yet)."""
    if not isinstance(doc, dict) or "schema_version" in doc:
        return doc, False
    items = list(doc.items())
    return dict(items[:1] + [("schema_version", 1)] + items[1:]), True


def renames_fail(docs, strict_v, published_v):
    groups = {}
    for d in docs:
        groups.setdefault("error" if d["error"] else d["kind"], []).append(d)
    added = 0
    for g in list(KINDS) + ["error"]:
        seen, tried, passed, base_ok = set(), 0, [], 0
        for d in groups.get(g, []):
            doc, add = with_version(d["doc"])
            v = strict_v[d["kind"]]
            if first_error(v, doc):
                continue
            base_ok += 1
            added += add
            for p, parent, _ in paths(doc):
                if p in seen or parent.replace("[]", "") in DATA_MAPS:
                    continue
                seen.add(p)
                m = renamed(doc, p.replace("[]", ""))
                if m is None:
                    continue
                tried += 1
                if not first_error(v, m):
                    passed.append(f"{p} (in {d['where']})")
        if not base_ok:
            report(False, f"json schema: no valid {g} document to rename fields in")
            continue
        report(not passed and tried > 0,
               f"json schema: renaming any of the {tried} fields seen in {g} documents makes them invalid",
               "still valid after renaming: " + "; ".join(passed[:8]))
    # A required field renamed fails the published schemas too, not only the strict ones.
    d = next((d for d in docs if d["kind"] == "split" and not d["error"]), None)
    if d:
        doc, _ = with_version(d["doc"])
        m = renamed(doc, "files_written")
        report(m is not None and first_error(published_v["split"], m) is not None and
               first_error(published_v["split"], doc) is None,
               "json schema: the published schemas reject a renamed required field (split files_written)")
    if added:
        print(f"# renames: schema_version was added to {added} documents that lack it, to test the "
              "rest of each document")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    vs = load_schemas()
    if vs is None:
        return 1
    strict_v, published_v = vs
    docs, problems = load_docs(sys.argv[1])
    report(not problems, f"json schema: each of the {len(docs)} --json runs of the tests printed one JSON document",
           "\n".join(problems))
    validate(docs, strict_v)
    bad = [d for d in docs if not exit_status_agrees(d)]
    report(not bad, f"json schema: the exit status of every --json run agrees with its document",
           "\n".join(f"{d['where']}: exit {d['rc']}, ok {d['doc'].get('ok')}" for d in bad[:8]))
    coverage(docs)
    renames_fail(docs, strict_v, published_v)
    return 1 if fails() else 0


if __name__ == "__main__":
    sys.exit(main())
