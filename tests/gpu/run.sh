#!/bin/sh
# tests/gpu/run.sh - the GPU verify checks, in one run on a machine with
# NVIDIA GPUs (not part of `make test`; CI has no GPU).
#
#   sh tests/gpu/prepare.sh        # here, once: fills .gpu/ (fallbacks, below)
#   sh tests/gpu/run.sh            # there, from the repo root; about 4-8 minutes
#
# Steps (each timed, summary table at the end, exit 1 if any failed):
#   1. build with `make CUDA=1` on that machine (libcjson/libyaml/zlib from
#      .gpu/*.deb when pkg-config does not find them, NCCL and cuBLAS from the
#      CUDA toolkit or from the Python wheels that PyTorch brings); when that
#      build fails, the .gpu/tpshard built by prepare.sh, said so;
#      `tpshard --version` shows the backends;
#   2. tiny checkpoints (every conformance split case in its layout, every
#      family of testdata/gen.py, the vllm and sglang layouts with replicated
#      KV heads and a padded vocabulary, F16/F32/F8 weights, block-FP8 and
#      compressed-tensors checkpoints with their scales, Phi-3's packed
#      projections, Qwen3-MoE and Mixtral experts with and without --ep):
#      verify --backend cuda passes and agrees with --backend cpu check by check;
#   3. a big synthetic Llama-shaped bf16 checkpoint (GPU_BIG, default 8G,
#      smaller if the scratch disk is short) split at tp 2, 4 and 8: cuda
#      passes, agrees with cpu on every check, GB/s of shard bytes (the bar:
#      >= 10 GB/s on one H200);
#   4. a 1 GiB one at tp 2, 4 and 8 and in the vllm layout at tp 8: cuda =
#      cpu; one flipped bit in a rank file is caught by cuda (and nccl with 8
#      GPUs), naming the tensor;
#   5. --backend nccl: one process driving the GPUs present (tp = the GPU
#      count, 8/4/2/1), and one process per rank with RANK/WORLD_SIZE/
#      LOCAL_RANK and --nccl-id-file; tp 8 on fewer GPUs is a clear error,
#      not a hang.
# Environment: GPU_TMP (scratch; default /dev/shm/tpshard-gpu, or
# ${TMPDIR:-/tmp}/tpshard-gpu when /dev/shm has under 24 GiB free and less
# than it), GPU_BIG (8G), GPU_BUDGET (seconds for the whole run, default 540:
# later steps are skipped, and say so, when it runs out), GPU_ONLY_BIG=1
# (steps 1 and 3 only: the throughput figures, e.g. with GPU_BIG=24G), JOBS (make -j,
# default nproc), KEEP=1 (keep the scratch directory).
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
remaining() { echo $((${GPU_BUDGET:-540} - ($(date +%s) - T0))); }

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
    line = "%.2f GB/s (%.2f GB in %.2f s" % (s["gb_per_s"], s["bytes"] / 1e9, s["seconds"])
    if s.get("setup_seconds", 0) > 0:
        line += "; %.2f s of it opening the backend: %.2f GB/s after" % (
            s["setup_seconds"], s["bytes"] / 1e9 / max(s["seconds"] - s["setup_seconds"], 1e-9))
    print(line + ")")
except Exception as e:
    print("n/a (%s)" % e)' "$1" 2>&1
}

# ---------------------------------------------------------------- 1. build
echo "# tpshard GPU checks: $(date -u), $(uname -n)"
nvidia-smi -L 2>&1 | sed 's/^/# /'
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "# GPUs: $NGPU; scratch $W ($(df -h "$SCR" | awk 'NR==2 {print $4}') free)"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
MAKE=make
command -v make >/dev/null 2>&1 || MAKE=$top/.gpu/make
# libcjson, libyaml, zlib: pkg-config's, else Debian's .debs unpacked here
MKARGS=""
if ! pkg-config --exists libcjson yaml-0.1 zlib 2>/dev/null; then
  S=$W/sysroot
  mkdir -p "$S"
  for d in "$top"/.gpu/*.deb; do [ -f "$d" ] && dpkg-deb -x "$d" "$S"; done
  L=$S/usr/lib/x86_64-linux-gnu
  echo "# libcjson/libyaml/zlib not found by pkg-config: using .gpu/*.deb in $S"
  MKARGS="PKG_CFLAGS=-I$S/usr/include\ -I$S/usr/include/cjson PKG_LIBS=-L$L\ -lcjson\ -lyaml\ -lz\ -Wl,-rpath,$L"
  export LD_LIBRARY_PATH="$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# NCCL and cuBLAS: the toolkit's, else the nvidia-* wheels' (libnccl.so.2 and
# libcublas.so.13 without the .so links the linker wants): a link farm
FARM=$W/farm
mkdir -p "$FARM/include" "$FARM/lib"
wheels=$(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d) for p in nvidia.__path__ for d in ("nccl", "cublas", "cuda_runtime")))' 2>/dev/null)
for lib in nccl cublas cublasLt cudart; do
  for dir in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" /usr/lib/x86_64-linux-gnu $(for w in $wheels; do echo "$w/lib"; done); do
    f=$(ls "$dir"/lib$lib.so "$dir"/lib$lib.so.[0-9]* 2>/dev/null | head -n 1)
    [ -n "$f" ] && { ln -sf "$f" "$FARM/lib/lib$lib.so"; ln -sf "$f" "$FARM/lib/$(basename "$f")"; break; }
  done
done
for h in nccl.h cublas_v2.h; do
  for dir in "$CUDA_HOME/include" /usr/include $(for w in $wheels; do echo "$w/include"; done); do
    [ -f "$dir/$h" ] && { ln -sf "$dir/$h" "$FARM/include/$h"; break; }
  done
done
[ -e "$FARM/include/nccl.h" ] || { [ -f "$top/.gpu/nccl.h" ] && cp "$top/.gpu/nccl.h" "$FARM/include/"; }
[ -e "$FARM/include/cublas_v2.h" ] || for w in $wheels; do
  [ -d "$w/include" ] && for h in "$w"/include/*.h; do ln -sf "$h" "$FARM/include/"; done; done
echo "# link farm: $(ls "$FARM/lib" | tr '\n' ' ')"
export LD_LIBRARY_PATH="$FARM/lib:$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
build() {
  eval "\"$MAKE\" CUDA=1 -j$JOBS CUDA_HOME=$CUDA_HOME NCCL_HOME=$FARM $MKARGS tpshard build/gen_llama"
}
step "make CUDA=1 -j$JOBS (on this machine)" build
if [ ! -x "$TPS" ] || ! "$TPS" --version >/dev/null 2>&1; then
  if [ -x "$top/.gpu/tpshard" ]; then
    echo "# the build here failed: using .gpu/tpshard (built by prepare.sh)"
    cp "$top/.gpu/tpshard" "$TPS"
  fi
fi
[ -x "$TPS" ] || { echo "no binary: stopping"; cat "$SUMMARY"; exit 1; }
GEN=$top/build/gen_llama
[ -x "$GEN" ] || GEN=$top/.gpu/gen_llama
step "tpshard --version lists cuda and nccl" sh -c "'$TPS' --version && '$TPS' --version | grep -q 'backends: cpu cuda nccl'"
"$TPS" --version | sed 's/^/# /'
if [ "$NGPU" -lt 1 ]; then
  step "a GPU is visible (nvidia-smi -L)" false
  step "--backend cuda without a GPU: clear error, exit 1" sh -c \
    "'$TPS' verify testdata/conformance/llama-tp3/model --backend cuda; [ \$? = 1 ]"
  echo; cat "$SUMMARY"; exit 1
fi

# ---------------------------------------------------------------- 2. tiny
if [ "${GPU_ONLY_BIG:-0}" != 1 ]; then
tiny() { # DIR SOURCE: cuda verify passes and agrees with cpu
  "$TPS" verify "$1" --source "$2" --backend cuda --json >"$1.cuda.json" || return 1
  "$TPS" verify "$1" --source "$2" --backend cpu --json >"$1.cpu.json"
  compare_json "$1.cuda.json" "$1.cpu.json"
}
for c in testdata/conformance/*/; do
  c=${c%/}; name=$(basename "$c")
  grep -q '"expect": "split"' "$c/case.json" || continue
  tp=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tp"])' "$c/case.json")
  lay=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("layout", "dtensor"))' "$c/case.json")
  "$TPS" split "$c/model" --tp "$tp" --layout "$lay" -o "$W/$name" -q || { step "split $name" false; continue; }
  step "cuda = cpu on $name (tp $tp, layout $lay)" tiny "$W/$name" "$c/model"
done
for fam in llama qwen2 qwen3 gemma3 gemma4; do
  tp=2; [ $fam = gemma3 ] && tp=1
  python3 testdata/gen.py $fam "$W/g-$fam" --seed 7 >/dev/null &&
    "$TPS" split "$W/g-$fam" --tp $tp -o "$W/g-$fam-s" -q || { step "make $fam" false; continue; }
  step "cuda = cpu on generated $fam (tp $tp)" tiny "$W/g-$fam-s" "$W/g-$fam"
done
for lay in vllm sglang; do # serving layouts: fused tensors, replicated KV heads, padding
  for tp in 4 8; do
    python3 testdata/gen.py llama "$W/s-$lay-$tp" --heads 8 --kv-heads 2 --vocab 250 --seed 5 >/dev/null &&
      "$TPS" split "$W/s-$lay-$tp" --tp $tp --layout $lay -o "$W/s-$lay-$tp-s" -q ||
      { step "make $lay tp $tp" false; continue; }
    step "cuda = cpu on llama, layout $lay, tp $tp (8 heads, 2 KV heads, vocab 250)" tiny "$W/s-$lay-$tp-s" "$W/s-$lay-$tp"
  done
done
for c in .gpu/models/*/; do # FP8 scales, packed Phi-3, stacked experts (prepare.sh made them)
  [ -f "$c/args" ] || continue
  c=${c%/}; name=$(basename "$c")
  read -r tp lay ep <"$c/args"
  "$TPS" split "$c" --tp "$tp" --layout "$lay" $ep -o "$W/q-$name" -q || { step "split $name" false; continue; }
  step "cuda = cpu on $name (tp $tp, layout $lay${ep:+, $ep})" tiny "$W/q-$name" "$c"
done
sed '/^checks:/,$d' plans/llama.yaml >"$W/nocheck.yaml"
for dt in F16 F32 F8_E4M3; do
  python3 testdata/gen.py llama "$W/d-$dt" --dtype $dt --hidden 40 --inter 30 --vocab 37 >/dev/null &&
    "$TPS" split "$W/d-$dt" --tp 3 --plan "$W/nocheck.yaml" -o "$W/d-$dt-s" -q ||
    { step "make $dt" false; continue; }
  step "cuda = cpu on $dt weights (tp 3)" tiny "$W/d-$dt-s" "$W/d-$dt"
done

fi
# ---------------------------------------------------------------- 3. big, tp 2, 4, 8
bigsize() { # prints the model size that fits the scratch disk (model + one split + slack)
  avail=$(df -Pk "$SCR" | awk 'NR==2 {print $4}')
  want=$(echo "$BIG" | awk '{ n = $1 + 0; u = substr($1, length($1)); m = (u == "G") ? 1048576 : (u == "M") ? 1024 : 1; print int(n * m) }')
  while [ $((want * 2 + 1048576)) -gt "$avail" ] && [ "$want" -gt 1048576 ]; do want=$((want / 2)); done
  echo $((want / 1048576))G
}
BIGSZ=$(bigsize)
echo "# big model: $BIGSZ (asked $BIG)"
step "gen_llama $BIGSZ" "$GEN" "$W/big" --size "$BIGSZ" -q
big() { # TP: split, cuda >= 10 GB/s, cuda = cpu on every check
  tp=$1 d=$W/big-tp$1
  [ "$(remaining)" -gt 60 ] || { echo "skipped: $(remaining) s left of the budget"; return 1; }
  rm -rf "$d"
  "$TPS" split "$W/big" --tp "$tp" -o "$d" -q || return 1
  "$TPS" verify "$d" --source "$W/big" --backend cuda --json >"$d.cuda.json"
  rc=$?
  figure "$BIGSZ tp $tp --backend cuda: $(gbs "$d.cuda.json")  [bar: >= 10 GB/s]"
  "$TPS" verify "$d" --source "$W/big" --backend cpu --json >"$d.cpu.json"
  figure "$BIGSZ tp $tp --backend cpu:  $(gbs "$d.cpu.json")"
  rm -rf "$d"
  [ $rc = 0 ] || return 1
  compare_json "$d.cuda.json" "$d.cpu.json" || return 1
  python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["summary"]; sys.exit(0 if s["gb_per_s"] >= 10 else 1)' "$d.cuda.json" ||
    { echo "below 10 GB/s"; return 1; }
}
if [ -f "$W/big/model.safetensors" ]; then
  for tp in 2 4 8; do step "big model at tp $tp: cuda passes, >= 10 GB/s, = cpu" big $tp; done
  # where the time goes (-v prints the backend's counters)
  "$TPS" split "$W/big" --tp 8 -o "$W/big-tp8" -q &&
    "$TPS" verify "$W/big-tp8" --source "$W/big" --backend cuda -v 2>&1 | grep -E 'cuBLAS|shard bytes' |
    while read -r l; do figure "$BIGSZ tp 8 -v: $l"; done
  for th in 8 32; do
    "$TPS" verify "$W/big-tp8" --source "$W/big" --backend cuda --threads $th --json >"$W/th.json" &&
      figure "$BIGSZ tp 8 --backend cuda --threads $th: $(gbs "$W/th.json")"
  done
  rm -rf "$W/big-tp8"
fi
h2d() {
  python3 - <<'EOF'
import time, torch
x = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()
y = torch.empty_like(x, device="cuda")
y.copy_(x); torch.cuda.synchronize()
t = time.time()
for _ in range(5): y.copy_(x, non_blocking=True)
torch.cuda.synchronize()
print("host-to-device copy of pinned memory (torch, 5 x 1 GiB): %.1f GB/s" % (5 * (1 << 30) / (time.time() - t) / 1e9))
EOF
}
figure "$(h2d 2>&1 | tail -n 1)"
rm -rf "$W/big"

# ---------------------------------------------------------------- 4. 1 GiB at tp 2, 4, 8; a flipped bit
if [ "${GPU_ONLY_BIG:-0}" != 1 ]; then
M1=$W/m1
step "gen_llama 1G" "$GEN" "$M1" --size 1G -q
for tp in 2 4 8; do
  "$TPS" split "$M1" --tp $tp -o "$W/m1-tp$tp" -q || { step "split 1G tp $tp" false; continue; }
  step "cuda = cpu on 1 GiB llama, tp $tp" tiny "$W/m1-tp$tp" "$M1"
  [ -f "$W/m1-tp$tp.cuda.json" ] && figure "1 GiB tp $tp --backend cuda: $(gbs "$W/m1-tp$tp.cuda.json"); cpu: $(gbs "$W/m1-tp$tp.cpu.json")"
done
"$TPS" split "$M1" --tp 8 --layout vllm -o "$W/m1-vllm" -q || step "split 1G --layout vllm" false
step "cuda = cpu on 1 GiB llama, layout vllm, tp 8" tiny "$W/m1-vllm" "$M1"
# block FP8 (scales widened to F32 in the vllm layout) and a Qwen3-MoE with 64
# experts a layer, stacked at tp 8 and expert-parallel
if [ "$(remaining)" -gt 60 ]; then
  "$GEN" "$W/f8" --size 1G --fp8 --head-dim 128 --kv-heads 8 --intermediate 8192 -q >/dev/null && "$TPS" split "$W/f8" --tp 8 --layout vllm -o "$W/f8-vllm" -q &&
    step "cuda = cpu on 1 GiB block-FP8 llama, layout vllm, tp 8" tiny "$W/f8-vllm" "$W/f8" ||
    step "make the 1 GiB FP8 model" false
  rm -rf "$W/f8" "$W/f8-vllm"
  "$GEN" "$W/moe" --size 1G --experts 64 --moe-intermediate 256 --hidden 2048 -q >/dev/null &&
    "$TPS" split "$W/moe" --tp 8 --layout vllm -o "$W/moe-tp" -q &&
    "$TPS" split "$W/moe" --tp 8 --layout vllm --ep -o "$W/moe-ep" -q &&
    step "cuda = cpu on a 1 GiB Qwen3-MoE (64 experts), layout vllm, tp 8" tiny "$W/moe-tp" "$W/moe" &&
    step "cuda = cpu on the same MoE, layout vllm, tp 8 --ep" tiny "$W/moe-ep" "$W/moe" ||
    step "make the 1 GiB MoE model" false
  rm -rf "$W/moe" "$W/moe-tp" "$W/moe-ep"
fi
[ -f "$W/m1-vllm.cuda.json" ] && figure "1 GiB vllm tp 8 --backend cuda: $(gbs "$W/m1-vllm.cuda.json"); cpu: $(gbs "$W/m1-vllm.cpu.json")"
rm -rf "$W/m1-vllm"
flip() { # FILE: flips a mantissa bit in the middle of rank 3's first sharded up_proj; prints it
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
  grep -v '^ *ok' "$1.flip.$3.txt" | head -n 20
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
d=$W/m1-tp$ntp
[ -d "$d" ] || "$TPS" split "$M1" --tp $ntp -o "$d" -q
nccl1() {
  [ -f "$d.cpu.json" ] || "$TPS" verify "$d" --source "$M1" --backend cpu --json >"$d.cpu.json"
  timeout 300 "$TPS" verify "$d" --source "$M1" --backend nccl --json >"$d.nccl.json" &&
    compare_json "$d.nccl.json" "$d.cpu.json"
}
step "nccl, one process, $ntp GPU(s) (tp $ntp) = cpu" nccl1
[ -f "$d.nccl.json" ] && figure "1 GiB tp $ntp --backend nccl (1 process): $(gbs "$d.nccl.json")"
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
  grep -v '^ *ok' "$W/mp.0.txt" | tail -n 12
  [ $st = 0 ] && grep -q '^verify: PASS' "$W/mp.0.txt" && grep -q 'processes' "$W/mp.0.txt" && [ ! -e "$id" ]
}
step "nccl, $ntp process(es) (RANK/WORLD_SIZE, --nccl-id-file)" ncclmp
toomany() {
  timeout 120 "$TPS" verify "$W/m1-tp8" --backend nccl >"$W/toomany.txt" 2>&1
  rc=$?
  cat "$W/toomany.txt"
  [ $rc = 1 ] && grep -qi 'GPU' "$W/toomany.txt"
}
[ "$NGPU" -lt 8 ] && step "nccl with tp 8 on $NGPU GPU(s): clear error, exit 1, no hang" toomany

fi
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
