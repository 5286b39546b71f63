#!/bin/sh
# split, check and merge as a user and a CI pipeline drive them: usage errors,
# default output, --ranks, --force, --dry-run, --json, refusals, corruption.
. "$TOP/tests/cli/lib.sh"
C="$TOP/testdata/conformance"
L="$C/llama-tp4-uneven-vocab/model"

expect_exit 2 "no arguments is a usage error" -- tps
expect_exit 2 "unknown command" -- tps frobnicate
expect_exit 0 "split -h" -- tps split -h
expect_stdout_has "usage: tpshard split MODEL --tp N" "split -h prints the synopsis"
expect_exit 2 "split without --tp" -- tps split "$L"
expect_stderr_has "--tp" "missing --tp is named"
expect_exit 2 "split --tp 0" -- tps split "$L" --tp 0
expect_exit 2 "split --tp abc" -- tps split "$L" --tp abc
expect_exit 2 "split --tp 2x" -- tps split "$L" --tp 2x
expect_exit 2 "split with an unknown option" -- tps split "$L" --tp 2 --bogus
expect_exit 2 "--plan and --family conflict" -- tps split "$L" --tp 2 --plan x.yaml --family llama
expect_exit 2 "--ranks beyond tp" -- tps split "$L" --tp 4 --ranks 4 -o "$T/x"
expect_exit 2 "--ranks malformed" -- tps split "$L" --tp 4 --ranks 1-0 -o "$T/x"
expect_exit 2 "--max-part-size malformed" -- tps split "$L" --tp 4 --max-part-size 5Q -o "$T/x"
expect_exit 0 "--version" -- tps --version
expect_stdout_has "built-in plans: deepseek_v3 gemma3 gemma4 gpt_oss llama mistral mixtral phi3 qwen2 qwen3 qwen3_moe" "--version lists the plans"

# Default output: <name>-tp<N> beside the input, for a file and a directory.
mkdir -p "$T/in" && cp "$L/model.safetensors" "$T/in/model.safetensors" && cp "$L/config.json" "$T/in/"
expect_exit 0 "split FILE --tp 2 without -o" -- tps split "$T/in/model.safetensors" --tp 2
[ -f "$T/in/model-tp2/model-rank-1-part-0.safetensors" ] && [ -f "$T/in/model-tp2/tpshard.json" ] &&
  ok "writes model-tp2/ beside the file" || notok "default output beside the file"
expect_stdout_has "model-tp2" "says where it wrote"
cp -r "$L" "$T/llama"
expect_exit 0 "split DIR --tp 4 without -o" -- tps split "$T/llama" --tp 4
[ -f "$T/llama-tp4/model-rank-3-part-0.safetensors" ] && ok "writes llama-tp4/ beside the directory" ||
  notok "default output beside the directory"
[ -f "$T/llama-tp4/config.json" ] && ok "config.json copied" || notok "config.json copied"

# An existing output is refused without --force; --force replaces it and
# removes rank files the new output does not have.
expect_exit 1 "existing output is refused" -- tps split "$T/llama" --tp 4
expect_stderr_has "--force" "the refusal says --force"
expect_exit 0 "--force replaces it with tp 2" -- tps split "$T/llama" --tp 2 -o "$T/llama-tp4" --force
[ ! -e "$T/llama-tp4/model-rank-3-part-0.safetensors" ] && [ -f "$T/llama-tp4/model-rank-1-part-0.safetensors" ] &&
  ok "stale rank files of the old output are gone" || notok "stale rank files removed"
expect_exit 0 "check after --force" -- tps check "$T/llama-tp4"
expect_exit 1 "output into the model directory is refused" -- tps split "$T/llama" --tp 2 -o "$T/llama" --force

# --dry-run writes nothing; a rejected plan writes nothing.
expect_exit 0 "--dry-run" -- tps split "$L" --tp 4 --dry-run -o "$T/dry"
[ ! -e "$T/dry" ] && ok "--dry-run wrote nothing" || notok "--dry-run wrote something"
expect_stdout_has "Shard(1)" "--dry-run prints placements"
expect_exit 1 "tp 8 is rejected (kv heads 4)" -- tps split "$L" --tp 8 -o "$T/rej"
expect_stderr_has "num_key_value_heads" "the rejection names the config field"
[ ! -e "$T/rej" ] && ok "a rejected split writes nothing" || notok "a rejected split left files"
expect_exit 1 "plan shows a rejection as a failed check" -- tps plan "$L" --tp 8
expect_stdout_has "FAIL" "plan marks the failed check"

# No config.json and no --family: say what to pass; with --family it works.
mkdir -p "$T/nocfg" && cp "$L/model.safetensors" "$T/nocfg/"
expect_exit 1 "no config and no --family" -- tps split "$T/nocfg" --tp 2 -o "$T/nc"
expect_stderr_has "--family" "the error says to pass --family"
expect_exit 0 "no config with --family llama" -- tps split "$T/nocfg" --tp 2 -o "$T/nc" --family llama
expect_exit 1 "unknown family" -- tps split "$L" --tp 2 --family nope -o "$T/nf"
expect_stderr_has "llama" "unknown family lists the known ones"

# --ranks: only those files; check reports the directory partial (exit 3)
# and names the ranks missing; merge refuses.
expect_exit 0 "--ranks 1,3" -- tps split "$L" --tp 4 --ranks 1,3 -o "$T/part"
n=$(ls "$T/part"/model-rank-*.safetensors | wc -l)
[ "$n" = 2 ] && [ -f "$T/part/model-rank-3-part-0.safetensors" ] && ok "--ranks writes only those ranks" ||
  notok "--ranks wrote $n files"
expect_exit 3 "check of a --ranks directory: partial, exit 3" -- tps check "$T/part"
expect_stdout_has "0,2" "check names the ranks not written"
grep -q '^partial: ' "$OUT" && ! grep -q '^ok' "$OUT" && ok "check says partial, never ok" ||
  { notok "check says partial, never ok"; diag "$OUT"; }
expect_exit 1 "merge refuses missing ranks" -- tps merge "$T/part" -o "$T/pm"
expect_stderr_has "missing" "merge says ranks are missing"
# Another machine writes the other ranks into the same directory.
expect_exit 1 "a --ranks run that overlaps written ranks is refused" -- tps split "$L" --tp 4 --ranks 2-3 -o "$T/part"
expect_stderr_has "rank 3" "the refusal names the rank"
expect_exit 0 "--ranks 0,2 joins the directory" -- tps split "$L" --tp 4 --ranks 0,2 -o "$T/part" --max-part-size 16K
expect_exit 0 "the joined directory checks complete" -- tps check "$T/part"
grep -q "not written" "$OUT" && notok "no rank reported missing after joining" || ok "no rank reported missing after joining"
expect_exit 0 "merge of the joined directory" -- tps merge "$T/part" -o "$T/pm"
cmp -s "$T/pm/model.safetensors" "$L/model.safetensors" && ok "joined --ranks runs merge back to the source" ||
  notok "joined --ranks runs merge back to the source"

# --json documents parse and say what happened.
run tps split "$L" --tp 2 -o "$T/j" --json
[ "$RC" = 0 ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['ok'] and d['files_written']==2" "$OUT" &&
  ok "split --json" || { notok "split --json"; diag "$OUT"; }
for c in "inspect $L" "plan $L --tp 2" "check $T/j"; do
  run tps $c --json
  [ "$RC" = 0 ] && python3 -m json.tool "$OUT" >/dev/null && ok "$(echo $c | cut -d' ' -f1) --json parses" ||
    { notok "$c --json"; diag "$OUT"; }
done
run tps split "$L" --tp 8 -o "$T/j8" --json
[ "$RC" = 1 ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['ok'] is False and 'num_key_value_heads' in d['error']" "$OUT" &&
  ok "errors in --json mode are JSON" || { notok "JSON error document"; diag "$OUT"; }

# The rank files' metadata carries what a loader needs.
python3 - "$T/j/model-rank-1-part-0.safetensors" <<'PY' && ok "rank file __metadata__: format, tp_rank, tp_size, plan, placements" || notok "rank file metadata"
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]; m = json.loads(f.read(n))["__metadata__"]
assert m["format"] == "pt" and m["tp_rank"] == "1" and m["tp_size"] == "2" and m["plan"] == "llama", m
p = json.loads(m["placements"])
assert p["model.embed_tokens.weight"] == {"placement": "Shard(0)", "global_shape": [250, 64], "offset": 125}, p
assert p["model.layers.0.self_attn.o_proj.weight"]["placement"] == "Shard(1)"
assert "model.norm.weight" not in p
PY

# check catches one flipped bit, a truncated file, a missing rank file.
cp -r "$T/j" "$T/flip"
python3 - "$T/flip/model-rank-0-part-0.safetensors" <<'PY'
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
b[8 + n + 100] ^= 0x04; open(p, "wb").write(b)
PY
expect_exit 1 "check catches a one-bit flip" -- tps check "$T/flip"
expect_stderr_has "CRC32" "the flip is reported as a CRC mismatch naming the tensor"
cp -r "$T/j" "$T/trunc"
python3 -c "import os,sys; p=sys.argv[1]; os.truncate(p, os.path.getsize(p)-10)" "$T/trunc/model-rank-1-part-0.safetensors"
expect_exit 1 "check catches a truncated rank file" -- tps check "$T/trunc"
expect_stderr_has "model-rank-1-part-0.safetensors" "the truncated file is named"
cp -r "$T/j" "$T/miss" && rm "$T/miss/model-rank-1-part-0.safetensors"
expect_exit 1 "check catches a missing rank file" -- tps check "$T/miss"
expect_stderr_has "rank 1" "the missing rank is named"
expect_exit 1 "check of a directory without a manifest" -- tps check "$T/in"
expect_exit 1 "merge into an existing output without --force" -- sh -c "$TPSHARD merge '$T/j' -o '$T/mm' -q && $TPSHARD merge '$T/j' -o '$T/mm'"

# A row longer than a copy task's 4 MiB buffers (down_proj [8, 2200000] BF16
# split by columns: 4.4 MB a row): copied a slice of a row at a time, mapped
# or with pread; the rank files check, verify and merge back byte for byte.
gen llama "$T/longrow" --layers 1 --hidden 8 --heads 2 --kv-heads 2 --inter 2200000 --dtype BF16 >/dev/null
for how in mapped --no-mmap; do
  o="$T/longrow-$how"
  opt=; [ "$how" = --no-mmap ] && opt=--no-mmap
  # shellcheck disable=SC2086
  run tps split "$T/longrow" --tp 2 -o "$o" -q $opt
  if [ "$RC" = 0 ] && tps check "$o" -q >/dev/null 2>&1 && tps verify "$o" --source "$T/longrow" -q >/dev/null 2>&1 &&
     tps merge "$o" -o "$o-m" -q >/dev/null 2>&1 && cmp -s "$T/longrow/model.safetensors" "$o-m/model.safetensors"; then
    ok "rows longer than a task's buffers ($how): split, check, verify, merge byte for byte"
  else
    notok "rows longer than a task's buffers ($how): split exit $RC"; diag "$ERR"
  fi
  rm -rf "$o" "$o-m"
done
rm -rf "$T/longrow"
finish
