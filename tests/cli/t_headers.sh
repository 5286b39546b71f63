#!/bin/sh
# Every byte of a rank file is covered: the manifest records, per rank file,
# the length and CRC32 of its header (8-byte length, JSON with __metadata__,
# padding) beside the tensors' CRC32s. One value edited in a header (tp_rank,
# a placement, a global shape, an offset, the format) fails check, verify
# and merge, naming the file; every way of writing a directory (--ranks runs
# that join, --max-part-size parts, the serving layouts, a reshard) records
# the header CRCs; a manifest from before them still reads, with a warning.
. "$TOP/tests/cli/lib.sh"

# edit FILE OLD NEW: replaces the first OLD in FILE's header JSON by NEW (same length).
edit() {
  python3 - "$@" <<'PY'
import struct, sys
path, old, new = sys.argv[1], sys.argv[2].encode(), sys.argv[3].encode()
assert len(old) == len(new)
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
i = b.find(old, 8, 8 + n)
assert i >= 0, (old, bytes(b[8:8 + n]))
b[i:i + len(old)] = new
open(path, "wb").write(b)
PY
}
# header_fails NAME DIR FILE: check, verify and merge of DIR fail, naming FILE's header.
header_fails() {
  name=$1 d=$2 f=$3
  for cmd in check verify merge; do
    case $cmd in
      check) run tps check "$d" ;;
      verify) run tps verify "$d" --source "$M" ;;
      merge) rm -rf "$T/merged"; run tps merge "$d" -o "$T/merged" ;;
    esac
    if [ "$RC" = 1 ] && grep -q "error: .*$f: the header changed" "$ERR"; then
      ok "$name: $cmd fails, naming $f's header"
    else
      notok "$name: $cmd (exit $RC)"; diag "$ERR"; diag "$OUT"
    fi
  done
}

M="$T/llama"
gen llama "$M" --hidden 16 --heads 2 --kv-heads 2 --inter 16 --vocab 10 --layers 1 >/dev/null
run tps split "$M" --tp 2 -o "$T/base" -q
[ "$RC" = 0 ] || { notok "split the tiny llama"; diag "$ERR"; finish; }
expect_exit 0 "a fresh split passes check" -- tps check "$T/base"
run tps check "$T/base" --json
python3 - "$OUT" "$T/base/tpshard.json" <<'PY' && ok "check --json: headers_checked counts every rank file; the manifest records each header" || notok "headers_checked / manifest header fields"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["headers_checked"] == d["files_checked"] == 2, d
m = json.load(open(sys.argv[2]))
for f in m["files"]:
    assert f["header_bytes"] % 8 == 0 and 8 < f["header_bytes"] < f["bytes"], f
    assert 0 <= f["header_crc32"] < 2 ** 32, f
for f in m["source"]["files"]:
    assert f["bytes"] > 0, f
PY

# The edits of the issue, each in rank 1's header, each the same length.
R1=model-rank-1-part-0.safetensors
for e in '"tp_rank":"1"|"tp_rank":"0"|tp_rank 1 to 0' \
         '\"placement\":\"Shard(0)\"|\"placement\":\"Shard(1)\"|lm_head placement Shard(0) to Shard(1)' \
         '\"global_shape\":[10,16]|\"global_shape\":[11,16]|global_shape [10,16] to [11,16]' \
         '\"offset\":5|\"offset\":4|offset 5 to 4' \
         '"format":"pt"|"format":"pu"|format pt to pu' \
         '"dtype":"BF16"|"dtype": "F16"|a dtype in the tensor table (BF16 to F16)'; do
  old=${e%%|*} rest=${e#*|}; new=${rest%%|*} what=${rest#*|}
  rm -rf "$T/ed"; cp -r "$T/base" "$T/ed"
  if edit "$T/ed/$R1" "$old" "$new" 2>"$ERR"; then header_fails "$what" "$T/ed" "$R1"
  else notok "edit $what"; diag "$ERR"; fi
done
# the padding: a space after the JSON made a tab
rm -rf "$T/ed"; cp -r "$T/base" "$T/ed"
python3 - "$T/ed/$R1" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
assert b[8 + n - 1] == 0x20, "no padding at the end of the header"
b[8 + n - 1] = 0x09
open(sys.argv[1], "wb").write(b)
PY
header_fails "the header's last padding byte" "$T/ed" "$R1"

# A manifest from before header CRCs: it still reads; check warns, says the
# headers were not checked (exit 0: the tensors all were), verify and merge work.
rm -rf "$T/old"; cp -r "$T/base" "$T/old"
python3 - "$T/old/tpshard.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for f in m["files"]:
    del f["header_bytes"], f["header_crc32"]
for f in m["source"]["files"]:
    del f["bytes"]
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
run tps check "$T/old"
if [ "$RC" = 0 ] && grep -q "warning: .*records no CRC32 of the rank files' headers" "$ERR" &&
   grep -q '^unchecked: the headers of 2 files' "$OUT"; then
  ok "an older manifest: check passes, warning that the headers are not checked"
else notok "older manifest: check (exit $RC)"; diag "$ERR"; diag "$OUT"; fi
run tps check "$T/old" --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["headers_checked"] == 0 and d["files_checked"] == 2, d' "$OUT" &&
  ok "an older manifest: check --json says headers_checked 0" || { notok "older manifest --json"; diag "$OUT"; }
expect_exit 0 "an older manifest: verify --source passes" -- tps verify "$T/old" --source "$M"
rm -rf "$T/old-merged"
run tps merge "$T/old" -o "$T/old-merged"
[ "$RC" = 0 ] && cmp -s "$T/old-merged/model.safetensors" "$M/model.safetensors" &&
  ok "an older manifest: merge gives the source back" || { notok "older manifest: merge (exit $RC)"; diag "$ERR"; }

# --ranks runs that join: both runs' files carry their header CRCs.
rm -rf "$T/join"
run tps split "$M" --tp 2 --ranks 1 -o "$T/join" -q &&
  run tps split "$M" --tp 2 --ranks 0 -o "$T/join" -q
run tps check "$T/join" --json
if [ "$RC" = 0 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["headers_checked"] == 2, d' "$OUT"; then
  ok "--ranks 1 then --ranks 0: every header recorded"
else notok "--ranks join (exit $RC)"; diag "$OUT"; diag "$ERR"; fi
edit "$T/join/$R1" '"tp_rank":"1"' '"tp_rank":"0"'
run tps check "$T/join"
[ "$RC" = 1 ] && grep -q "$R1: the header changed" "$ERR" &&
  ok "--ranks join: an edit in the first run's header is caught" || { notok "--ranks join edit (exit $RC)"; diag "$ERR"; }

# --max-part-size: every part's header.
rm -rf "$T/parts"
run tps split "$M" --tp 2 --max-part-size 1K -o "$T/parts" -q
np=$(ls "$T/parts" | grep -c '^model-rank-1-part-')
if [ "$RC" = 0 ] && [ "$np" -ge 2 ]; then
  edit "$T/parts/model-rank-1-part-1.safetensors" '"part":"1"' '"part":"0"'
  run tps check "$T/parts"
  [ "$RC" = 1 ] && grep -q "model-rank-1-part-1.safetensors: the header changed" "$ERR" &&
    ok "--max-part-size: an edit in part 1's header is caught" || { notok "parts edit (exit $RC)"; diag "$ERR"; }
else notok "--max-part-size 1K wrote $np parts of rank 1 (exit $RC)"; diag "$ERR"; fi

# The serving layouts, and a reshard (split of a split) that reads the headers.
Q="$T/qwen2"
gen qwen2 "$Q" --hidden 32 --heads 4 --kv-heads 2 --inter 32 --vocab 64 --layers 1 >/dev/null
for lay in vllm sglang; do
  rm -rf "$T/$lay"
  run tps split "$Q" --tp 2 --layout "$lay" -o "$T/$lay" -q
  [ "$RC" = 0 ] || { notok "split --layout $lay"; diag "$ERR"; continue; }
  expect_exit 0 "$lay: check passes" -- tps check "$T/$lay"
  edit "$T/$lay/$R1" '"tp_rank":"1"' '"tp_rank":"0"'
  run tps check "$T/$lay"
  [ "$RC" = 1 ] && grep -q "$R1: the header changed" "$ERR" &&
    ok "$lay: an edited tp_rank is caught" || { notok "$lay edit (exit $RC)"; diag "$ERR"; }
done
rm -rf "$T/re1"
run tps split "$T/base" --tp 1 --family llama -o "$T/re1" -q
if [ "$RC" = 0 ]; then
  expect_exit 0 "reshard tp 2 -> 1: check passes" -- tps check "$T/re1"
  expect_exit 0 "reshard tp 2 -> 1: verify --source the tp 2 directory passes" -- tps verify "$T/re1" --source "$T/base"
  expect_exit 0 "reshard tp 2 -> 1: verify --source the original passes" -- tps verify "$T/re1" --source "$M"
else notok "reshard tp 2 -> 1 (exit $RC)"; diag "$ERR"; fi
rm -rf "$T/re-ed"
run tps split "$T/ed" --tp 1 --family llama -o "$T/re-ed" -q
[ "$RC" = 1 ] && grep -q "$R1: the header changed" "$ERR" && [ ! -e "$T/re-ed/tpshard.json" ] &&
  ok "reshard of a directory whose header changed is refused" || { notok "reshard of an edited header (exit $RC)"; diag "$ERR"; }

finish
