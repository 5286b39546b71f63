#!/bin/sh
# tests/gpu/run.sh - the GPU verify checks, in one run on a machine with
# NVIDIA GPUs (not part of `make test`; CI has no GPU).
#
#   sh tests/gpu/run.sh            # from the repo root; about 3-6 minutes
#
# Steps (each timed, summary table at the end, exit 1 if any failed):
#   1. build with `make CUDA=1`; `tpshard --version` shows the backends;
#   2. tiny checkpoints (every conformance split case and testdata/gen.py's
#      families): verify --backend cuda passes and agrees with --backend cpu
#      check by check;
#   3. a synthetic Llama-shaped 1 GiB bf16 checkpoint (bench/gen_llama.c)
#      split at tp 2, 4 and 8: cuda passes, agrees with cpu, GB/s;
#   4. a big one (GPU_BIG, default 8G, smaller if memory is short) at tp 8:
#      --backend cuda GB/s of shard bytes (the bar: >= 10 GB/s on one H200)
#      and agreement with cpu on every check;
#   5. --backend nccl: one process driving the GPUs present (tp = GPU count
#      when it divides the model), and one process per rank with
#      RANK/WORLD_SIZE/LOCAL_RANK and --nccl-id-file; too few GPUs for the tp
#      is a clear error, not a hang;
#   6. one flipped bit in a rank file is caught by cuda (and nccl), naming the
#      tensor.
# Environment: GPU_TMP (scratch; default /dev/shm/tpshard-gpu, or
# ${TMPDIR:-/tmp}/tpshard-gpu when /dev/shm has under 24 GiB free and less
# than it), GPU_BIG (8G),
# JOBS (make -j, default nproc), KEEP=1 (keep the scratch directory).
set -u

top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 1
TPS=$top/tpshard
SCR=${GPU_TMP:-}
if [ -z "$SCR" ]; then
  # /dev/shm in a container is often small (64 MiB by default): the big model
  # needs ~20 GiB, so take the disk when it has more room
  shm=$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2 {print $4}')
  tmp=$(df -Pk "${TMPDIR:-/tmp}" 2>/dev/null | awk 'NR==2 {print $4}')
  SCR=/dev/shm/tpshard-gpu
  [ "${shm:-0}" -lt 25165824 ] && [ "${tmp:-0}" -gt "${shm:-0}" ] && SCR=${TMPDIR:-/tmp}/tpshard-gpu
fi
BIG=${GPU_BIG:-8G}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
T0=$(date +%s)
mkdir -p "$SCR" || { echo "cannot create $SCR"; exit 1; }
W=$(mktemp -d "$SCR/run.XXXXXX") || exit 1
cleanup() { [ "${KEEP:-0}" = 1 ] && echo "kept $W" || rm -rf "$W"; }
trap cleanup EXIT
trap 'cleanup; trap - EXIT; exit 130' INT TERM HUP

SUMMARY=$W/summary
FIG=$W/figures
: >"$SUMMARY"; : >"$FIG"
NFAIL=0
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
# step NAME CMD...: runs CMD (output to $W/log.N), records time and verdict.
N=0
step() {
  name=$1; shift
  N=$((N + 1))
  log=$W/log.$N
  t=$(now)
  if "$@" >"$log" 2>&1; then st=ok; else st=FAIL; NFAIL=$((NFAIL + 1)); fi
  dt=$(secs "$t" "$(now)")
  printf '%-4s %7ss  %s\n' "$st" "$dt" "$name" | tee -a "$SUMMARY"
  if [ $st = FAIL ]; then sed 's/^/      | /' "$log" | tail -n 25; fi
  return 0
}
figure() { echo "$*" | tee -a "$FIG"; }
remaining() { echo $((480 - ($(date +%s) - T0))); }

# compare A.json B.json: same verdict overall and for every (check, kind)
compare_json() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ka = {(c["check"], c["kind"]): c["ok"] for c in a["checks"]}
kb = {(c["check"], c["kind"]): c["ok"] for c in b["checks"]}
if ka.keys() != kb.keys():
    print("different checks:", sorted(set(ka) ^ set(kb))[:10]); sys.exit(1)
diff = [k for k in ka if ka[k] != kb[k]]
if diff or a["ok"] != b["ok"]:
    print("verdicts differ:", diff[:10], a["ok"], b["ok"]); sys.exit(1)
print(f"{len(ka)} checks agree, verdict {'PASS' if a['ok'] else 'FAIL'}")
EOF
}
# gbs FILE.json: "X.XX GB/s (N bytes in S s)"
gbs() {
  python3 -c 'import json,sys
try:
    s = json.load(open(sys.argv[1]))["summary"]
    print("%.2f GB/s (%.2f GB in %.2f s)" % (s["gb_per_s"], s["bytes"] / 1e9, s["seconds"]))
except Exception as e:
    print("n/a (%s)" % e)' "$1" 2>&1
}

# ---------------------------------------------------------------- 1. build
echo "# tpshard GPU checks: $(date -u), $(uname -n)"
nvidia-smi -L 2>&1 | sed 's/^/# /'
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "# GPUs: $NGPU; scratch $W ($(df -h "$SCR" | awk 'NR==2 {print $4}') free)"
step "make CUDA=1 -j$JOBS" make CUDA=1 -j"$JOBS"
[ -x "$TPS" ] || { echo "no binary: stopping"; cat "$SUMMARY"; exit 1; }
step "tpshard --version lists cuda and nccl" sh -c "'$TPS' --version && '$TPS' --version | grep -q 'backends: cpu cuda nccl'"
"$TPS" --version | sed 's/^/# /'
cc -O2 -o "$W/gen_llama" bench/gen_llama.c || echo "# cannot build bench/gen_llama.c"
if [ "$NGPU" -lt 1 ]; then
  step "a GPU is visible (nvidia-smi -L)" false
  step "--backend cuda without a GPU: clear error, exit 1" sh -c \
    "'$TPS' verify testdata/conformance/llama-tp3/model --backend cuda; [ \$? = 1 ]"
  echo; cat "$SUMMARY"; exit 1
fi

# ---------------------------------------------------------------- 2. tiny
tiny() { # DIR SOURCE: cuda verify passes and agrees with cpu
  "$TPS" verify "$1" --source "$2" --backend cuda --json >"$1.cuda.json" || return 1
  "$TPS" verify "$1" --source "$2" --backend cpu --json >"$1.cpu.json"
  compare_json "$1.cuda.json" "$1.cpu.json"
}
for c in testdata/conformance/*/; do
  c=${c%/}; name=$(basename "$c")
  grep -q '"expect": "split"' "$c/case.json" || continue
  tp=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tp"])' "$c/case.json")
  "$TPS" split "$c/model" --tp "$tp" -o "$W/$name" -q || { step "split $name" false; continue; }
  step "cuda = cpu on $name (tp $tp)" tiny "$W/$name" "$c/model"
done
for fam in llama qwen2 qwen3 gemma3 gemma4; do
  tp=2; [ $fam = gemma3 ] && tp=1
  python3 testdata/gen.py $fam "$W/g-$fam" --seed 7 >/dev/null &&
    "$TPS" split "$W/g-$fam" --tp $tp -o "$W/g-$fam-s" -q || { step "make $fam" false; continue; }
  step "cuda = cpu on generated $fam (tp $tp)" tiny "$W/g-$fam-s" "$W/g-$fam"
done
sed '/^checks:/,$d' plans/llama.yaml >"$W/nocheck.yaml"
for dt in F16 F32 F8_E4M3; do
  python3 testdata/gen.py llama "$W/d-$dt" --dtype $dt --hidden 40 --inter 30 --vocab 37 >/dev/null &&
    "$TPS" split "$W/d-$dt" --tp 3 --plan "$W/nocheck.yaml" -o "$W/d-$dt-s" -q ||
    { step "make $dt" false; continue; }
  step "cuda = cpu on $dt weights (tp 3)" tiny "$W/d-$dt-s" "$W/d-$dt"
done

# ---------------------------------------------------------------- 3. 1 GiB at tp 2, 4, 8
M1=$W/m1
step "gen_llama 1G" "$W/gen_llama" "$M1" --size 1G -q
for tp in 2 4 8; do
  "$TPS" split "$M1" --tp $tp -o "$W/m1-tp$tp" -q || { step "split 1G tp $tp" false; continue; }
  step "cuda = cpu on 1 GiB llama, tp $tp" tiny "$W/m1-tp$tp" "$M1"
  [ -f "$W/m1-tp$tp.cuda.json" ] && figure "1 GiB tp $tp --backend cuda: $(gbs "$W/m1-tp$tp.cuda.json"); cpu: $(gbs "$W/m1-tp$tp.cpu.json")"
done

# ---------------------------------------------------------------- 6. one flipped bit
flip() { # FILE: flips a mantissa bit in the middle of rank 3's first sharded tensor; prints it
  python3 - "$1" <<'EOF'
import json, struct, sys
p = sys.argv[1]
with open(p, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n)); h.pop("__metadata__", None)
    man = {t["name"]: t for t in json.load(open(p.rsplit("/", 1)[0] + "/tpshard.json"))["tensors"]}
    name = sorted(k for k in h if man[k]["dim"] >= 0 and "mlp.up_proj" in k)[0]
    s, e = h[name]["data_offsets"]
    at = 8 + n + s + ((e - s) // 2 & ~1)
    f.seek(at); v = f.read(1)[0]; f.seek(at); f.write(bytes([v ^ 4]))
print(name)
EOF
}
flipped() { # DIR SOURCE BACKEND TENSOR: exit 1 and the tensor named
  "$TPS" verify "$1" --source "$2" --backend "$3" >"$1.flip.$3.txt"
  rc=$?
  [ $rc = 1 ] && grep -q "$4" "$1.flip.$3.txt" && grep -q '^verify: FAIL' "$1.flip.$3.txt"
}
if [ -d "$W/m1-tp8" ]; then
  f=$W/m1-tp8/model-rank-3-part-0.safetensors
  t=$(flip "$f")
  step "one flipped bit in rank 3's $t: cuda fails naming it" flipped "$W/m1-tp8" "$M1" cuda "$t"
  [ "$NGPU" -ge 8 ] && step "one flipped bit: nccl (8 GPUs) fails naming it" flipped "$W/m1-tp8" "$M1" nccl "$t"
  flip "$f" >/dev/null # flip it back
fi

# ---------------------------------------------------------------- 5. nccl
ntp=0
for t in 8 4 2 1; do [ "$NGPU" -ge $t ] && { ntp=$t; break; }; done
if [ $ntp -ge 1 ]; then
  d=$W/m1-tp$ntp
  [ -d "$d" ] || "$TPS" split "$M1" --tp $ntp -o "$d" -q
  nccl1() {
    [ -f "$d.cpu.json" ] || "$TPS" verify "$d" --source "$M1" --backend cpu --json >"$d.cpu.json"
    timeout 300 "$TPS" verify "$d" --source "$M1" --backend nccl --json >"$d.nccl.json" &&
      compare_json "$d.nccl.json" "$d.cpu.json"
  }
  step "nccl, one process, $ntp GPUs (tp $ntp) = cpu" nccl1
  [ -f "$d.nccl.json" ] && figure "1 GiB tp $ntp --backend nccl (1 process): $(gbs "$d.nccl.json")"
  if [ $ntp -ge 2 ]; then
    ncclmp() {
      id=$W/nccl-id.$$; rm -f "$id"
      pids=""
      r=0
      while [ $r -lt $ntp ]; do
        RANK=$r WORLD_SIZE=$ntp LOCAL_RANK=$r timeout 300 "$TPS" verify "$d" --source "$M1" \
          --backend nccl --nccl-id-file "$id" >"$W/mp.$r.txt" 2>&1 &
        pids="$pids $!"
        r=$((r + 1))
      done
      st=0
      for p in $pids; do wait $p || st=1; done
      cat "$W/mp.0.txt"
      [ $st = 0 ] && grep -q '^verify: PASS' "$W/mp.0.txt"
    }
    step "nccl, $ntp processes (RANK/WORLD_SIZE, --nccl-id-file)" ncclmp
  fi
fi
toomany() {
  "$TPS" split "$M1" --tp 8 -o "$W/m1-tp8" -q 2>/dev/null
  timeout 120 "$TPS" verify "$W/m1-tp8" --backend nccl >"$W/toomany.txt" 2>&1
  rc=$?
  cat "$W/toomany.txt"
  [ $rc = 1 ] && grep -qi 'GPU' "$W/toomany.txt"
}
[ "$NGPU" -lt 8 ] && step "nccl with tp 8 on $NGPU GPU(s): clear error, exit 1, no hang" toomany

# ---------------------------------------------------------------- 4. big
big() {
  avail=$(df -Pk "$SCR" | awk 'NR==2 {print $4}')
  want=$(echo "$BIG" | awk '{ n = $1 + 0; u = substr($1, length($1)); m = (u == "G") ? 1048576 : (u == "M") ? 1024 : 1; print int(n * m) }')
  # model + one split + slack must fit
  while [ $((want * 2 + 1048576)) -gt "$avail" ] && [ "$want" -gt 1048576 ]; do want=$((want / 2)); done
  size=$((want / 1048576))G
  echo "big model: $size (asked $BIG; $((avail / 1048576)) GiB free)"
  [ "$(remaining)" -gt 150 ] || { echo "skipped: $(remaining) s left of the 8-minute budget"; return 1; }
  rm -rf "$W"/m1-tp2 "$W"/m1-tp4 "$W"/g-* "$W"/d-*
  "$W/gen_llama" "$W/big" --size "$size" -q || return 1
  "$TPS" split "$W/big" --tp 8 -o "$W/big-tp8" -q || return 1
  "$TPS" verify "$W/big-tp8" --source "$W/big" --backend cuda --json >"$W/big.cuda.json"
  rc=$?
  figure "$size tp 8 --backend cuda: $(gbs "$W/big.cuda.json")  [bar: >= 10 GB/s]"
  [ $rc = 0 ] || return 1
  if [ "$(remaining)" -gt 90 ]; then
    "$TPS" verify "$W/big-tp8" --source "$W/big" --backend cpu --json >"$W/big.cpu.json"
    figure "$size tp 8 --backend cpu:  $(gbs "$W/big.cpu.json")"
    compare_json "$W/big.cuda.json" "$W/big.cpu.json" || return 1
  else
    echo "cpu comparison skipped: $(remaining) s left"
  fi
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; sys.exit(0 if s["gb_per_s"] >= 10 else 1)' "$W/big.cuda.json" ||
    { echo "below 10 GB/s"; return 1; }
}
step "big model at tp 8: cuda >= 10 GB/s and = cpu" big

# ---------------------------------------------------------------- summary
echo
echo "# summary ($(($(date +%s) - T0)) s total)"
cat "$SUMMARY"
echo
echo "# figures"
cat "$FIG"
ok=$(grep -c '^ok' "$SUMMARY"); bad=$(grep -c '^FAIL' "$SUMMARY")
echo "$ok passed, $bad failed"
[ "$bad" -eq 0 ]
