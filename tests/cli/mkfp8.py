"""Makes a block-FP8 checkpoint from a BF16 LLaMA one, for the tests:
mkfp8.py SRC OUT [METHOD]. Every 2-D *_proj.weight becomes F8_E4M3 with a
weight_scale_inv of 16 x 16 blocks (DeepSeek-V3 / Qwen3-FP8 style:
quantization_config quant_method fp8, weight_block_size [16, 16]); the other
tensors stay as they are. METHOD other than fp8 only changes quant_method
(a checkpoint tpshard refuses)."""
import json
import os
import random
import struct
import sys

TOP = os.environ.get("TOP") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "testdata"))
sys.path.insert(0, os.path.join(TOP, "testdata", "conformance"))
import gen  # noqa: E402
import st  # noqa: E402

src, out = sys.argv[1], sys.argv[2]
method = sys.argv[3] if len(sys.argv) > 3 else "fp8"
_, tensors = st.read(os.path.join(src, "model.safetensors"))
rng = random.Random(1)
codes = [b for b in range(256) if b & 0x7F != 0x7F]  # every E4M3 code but NaN
new = {}
for name, (dt, shape, data) in tensors.items():
    if method == "fp8" and len(shape) == 2 and name.endswith("_proj.weight"):
        new[name] = ("F8_E4M3", shape, bytes(rng.choice(codes) for _ in range(shape[0] * shape[1])))
        sr, sc = -(-shape[0] // 16), -(-shape[1] // 16)
        new[name + "_scale_inv"] = ("F32", [sr, sc], struct.pack(f"<{sr * sc}f", *[0.01 + 0.001 * i for i in range(sr * sc)]))
    else:
        new[name] = (dt, shape, data)
os.makedirs(out, exist_ok=True)
gen.write_safetensors(os.path.join(out, "model.safetensors"), new, {"format": "pt"})
cfg = json.load(open(os.path.join(src, "config.json")))
cfg["quantization_config"] = ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [16, 16]}
                              if method == "fp8" else {"quant_method": method, "bits": 4})
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
