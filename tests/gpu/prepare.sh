#!/bin/sh
# tests/gpu/prepare.sh - fills .gpu/ (ignored by git) with what tests/gpu/run.sh
# needs on a GPU machine that has no package registry:
#   *.deb          Debian's libcjson, libyaml and zlib (runtime and -dev), which
#                  run.sh unpacks into its scratch directory when pkg-config
#                  does not find them there;
#   nccl.h         a fallback header when the machine has NCCL's library only;
#   make           a fallback GNU make;
#   tpshard        a `make CUDA=1` build made here, used only when the build
#                  on the GPU machine fails (run.sh says so);
#   gen_llama      bench/gen_llama.c built here (likewise a fallback);
#   models/        tiny FP8, Phi-3 and MoE checkpoints from the tests' oracles,
#                  each with the split run.sh checks (the GPU machine may lack numpy):
#                  FP8 experts (a refined grid, --ep, SGLang) and pipeline stages too.
# Run it from the repository root on a Debian/Ubuntu machine with apt-get and
# the CUDA toolkit; then send .gpu/ along with the tree.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
out=$top/.gpu
rm -rf "$out"
mkdir -p "$out"
(cd "$out" && apt-get download libcjson1 libcjson-dev libyaml-0-2 libyaml-dev zlib1g zlib1g-dev \
  2>/dev/null)
cuda=${CUDA_HOME:-/usr/local/cuda}
for h in "$cuda/include/nccl.h" /usr/include/nccl.h /usr/local/include/nccl.h; do
  [ -f "$h" ] && { cp "$h" "$out/nccl.h"; break; }
done
cp "$(command -v make)" "$out/make"
# a CUDA build of this tree, made in a copy so that ./tpshard stays as it is
b=$(mktemp -d)
trap 'rm -rf "$b"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$b"
(cd "$b" && make -s -j"$(nproc)" CUDA=1 CUDA_HOME="$cuda" tpshard build/gen_llama >/dev/null)
cp "$b/tpshard" "$b/build/gen_llama" "$out/"
# Tiny FP8 and mixture-of-experts/Phi-3 checkpoints, made here by the tests'
# oracles (numpy), each with the split to check in its "args" file
# (TP LAYOUT [--ep]): run.sh checks cuda = cpu on each.
py=$top/build/venv/bin/python
[ -x "$py" ] || { echo "prepare: build/venv is missing: run make test first" >&2; exit 1; }
mkdir -p "$out/models"
(cd "$top/tests/py" && "$py" - "$out/models" <<'PY'
import os, sys
import quant_oracle as q, family_oracle as fo, moe_quant_oracle as mq, packed_oracle as po
o = sys.argv[1]
def case(name, args, make):
    d = os.path.join(o, name)
    make(d)
    open(os.path.join(d, "args"), "w").write(args + "\n")
case("fp8-block-vllm4", "4 vllm", lambda d: q.make_model(d, "fp8-block-llama"))
case("fp8-block-dtensor2", "2 dtensor", lambda d: q.make_model(d, "fp8-block-llama"))
case("fp8-e8m0-sglang2", "2 sglang", lambda d: q.make_model(d, "fp8-block-h320-e8m0"))
case("ct-channel-vllm2", "2 vllm", lambda d: q.make_model(d, "ct-channel-qwen3"))
case("ct-tensor-vllm4", "4 vllm", lambda d: q.make_model(d, "ct-tensor-static-llama"))
case("phi3-vllm4", "4 vllm", lambda d: fo.phi3_checkpoint(d))
case("phi3-dtensor3", "3 dtensor", lambda d: fo.phi3_checkpoint(d))
case("qwen3moe-vllm2", "2 vllm", lambda d: fo.qwen3_moe_checkpoint(d))
case("qwen3moe-vllm4-ep", "4 vllm --ep", lambda d: fo.qwen3_moe_checkpoint(d))
case("qwen3moe-sglang2", "2 sglang", lambda d: fo.qwen3_moe_checkpoint(d))
case("qwen3moe-dtensor2", "2 dtensor", lambda d: fo.qwen3_moe_checkpoint(d))
case("mixtral-vllm2", "2 vllm", lambda d: fo.mixtral_checkpoint(d))
case("mixtral-sglang4-ep", "4 sglang --ep", lambda d: fo.mixtral_checkpoint(d))
# FP8 experts: vLLM's refined grid (96 rows a rank on 128-blocks), per-tensor with static
# input scales under --ep, SGLang's block FP8; pipeline stages (the args' rest is passed on)
refine = dict(H=256, I=384, D=128, block=(128, 128), layers=3)
case("moe-fp8-refined-vllm4", "4 vllm", lambda d: mq.build(d, "qwen3_moe", "fp8-block", **refine))
case("moe-fp8-refined-vllm2-pp2", "2 vllm --pp 2",
     lambda d: mq.build(d, "qwen3_moe", "fp8-block", **refine))
case("moe-fp8-tensor-vllm4-ep", "4 vllm --ep",
     lambda d: mq.build(d, "mixtral", "fp8-tensor", static=True, H=128))
case("moe-fp8-block-sglang2", "2 sglang", lambda d: mq.build(d, "qwen3_moe", "fp8-block"))
# packed methods: the BF16 products on the device, the dequant rows on the CPU
case("gptq-vllm2", "2 vllm", lambda d: po.build(d, "gptq", group=32))
case("awq-vllm4", "4 vllm", lambda d: po.build(d, "awq", H=256, I=512, hd=64, group=64))
case("nvfp4-vllm2", "2 vllm", lambda d: po.build(d, "nvfp4"))
case("gptq-pad-vllm4", "4 vllm --pad-intermediate", lambda d: po.build(d, "gptq", I=224, group=32))
case("moe-w4a16-vllm2", "2 vllm", lambda d: po.build_moe(d, "ct"))
# FP8 padded, Gemma 4's MoE (fused 3-D block FP8, per-expert 2-D), gpt-oss's MXFP4 experts
case("fp8-pad-vllm4", "4 vllm --pad-intermediate",
     lambda d: mq.build(d, "qwen3_moe", "fp8-block", I=96, block=(16, 16)))
sys.path.insert(0, os.path.join(os.path.dirname(os.getcwd()), "engines"))
import models as em, gptoss_oracle as go
case("gemma4-moe-fp8-vllm2", "2 vllm", em.MODELS["gemma4-moe-fp8-block"])
case("gemma4-moe-pe-vllm4", "4 vllm", em.MODELS["gemma4-moe-pe"])
case("gptoss-mxfp4-vllm4", "4 vllm", em.MODELS["gpt_oss-mxfp4"])
# gpt-oss's BF16 experts, each expert's rank slice transposed in the rank files
case("gptoss-bf16-vllm2", "2 vllm", em.MODELS["gpt_oss"])
PY
)
ls -l "$out"
du -sh "$out"
