"""Every change this harness makes to the engines' code, with why.

Rule (DESIGN.md, "The engines as oracle"): only a kernel-selection check that
refuses on a CPU may be patched, never a loaded value.  Each entry of PATCHES
is printed by `run.py --patches` and listed in the README.
"""
PATCHES = []


def _note(engine, where, why):
    PATCHES.append((engine, where, why))


def apply_vllm():
    from vllm.model_executor.kernels.linear.scaled_mm import cpu as scaled_mm_cpu

    ok = classmethod(lambda cls, compute_capability=None: (True, None))
    for name in ("CPUFp8BlockScaledMMKernel", "CPUFp8PerTensorScaledMMLinearKernel"):
        getattr(scaled_mm_cpu, name).is_supported = ok
        _note("vllm", f"model_executor/kernels/linear/scaled_mm/cpu.py {name}.is_supported",
              "answers True: the FP8 W8A16 CPU GEMM wants AMX tiles and the fp8_scaled_mm_cpu op, "
              "absent from the CUDA wheel on this CPU, so no FP8 linear kernel is found and the "
              "layer refuses to be built; the kernel only runs at forward and in "
              "process_weights_after_loading, neither of which the oracle runs, and "
              "the parameters are created by Fp8LinearMethod.create_weights whatever the kernel")
    apply_vllm_nvfp4_kernel()
    apply_vllm_wna16_moe_backend()
    apply_vllm_mxfp4_cpu_experts()


def apply_vllm_mxfp4_cpu_experts():
    """gpt-oss's MXFP4 experts on an x86 CPU without AMX tiles: vLLM's CPU backend."""
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe
    from vllm.platforms import current_platform

    cpu_moe.CPUExpertsMxfp4._supports_current_device = staticmethod(current_platform.is_cpu)
    _note("vllm", "layers/fused_moe/experts/cpu_moe.py CPUExpertsMxfp4._supports_current_device",
          "answers is_cpu() without its AMX-tile test: on an x86 CPU without AMX (this AMD EPYC) "
          "no MXFP4 MoE backend is found and the layer refuses to be built (No MXFP4 MoE backend "
          "supports the deployment configuration); the CPU backend is the one vLLM picks on a "
          "CPU with AMX, its round-up (x32) sets the experts' parameter shapes at "
          "create_weights, and its kernel runs only at forward and in "
          "process_weights_after_loading, neither of which the oracle runs")


def apply_vllm_nvfp4_kernel():
    """NVFP4 linears on this CPU: the emulation kernel, which vLLM lists for CUDA only."""
    from vllm.model_executor.kernels.linear import NvFp4LinearLayerConfig
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.model_executor.layers.quantization import modelopt
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import (
        compressed_tensors_w4a4_nvfp4 as ct_nvfp4)

    def emulation(use_a16=False):
        return EmulationNvFp4LinearKernel(NvFp4LinearLayerConfig())
    modelopt.init_nvfp4_linear_kernel = emulation
    ct_nvfp4.init_nvfp4_linear_kernel = emulation
    _note("vllm", "kernels/linear/__init__.py init_nvfp4_linear_kernel (as modelopt.py and "
          "compressed_tensors_w4a4_nvfp4.py import it)",
          "returns EmulationNvFp4LinearKernel: the CPU platform lists no NVFP4 GEMM, so the "
          "linear refuses to be built; the kernel runs at forward and in "
          "process_weights_after_loading only, and the parameters are created by "
          "create_weights whatever the kernel")


def apply_vllm_wna16_moe_backend():
    """Packed-integer experts on this CPU: Marlin's MoE backend, as on a GPU."""
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16
    from vllm.model_executor.layers.quantization import auto_awq, auto_gptq
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_wna16 as ct_moe)

    orig = int_wna16.select_wna16_moe_backend

    def select(*a, **k):
        try:
            return orig(*a, **k)
        except NotImplementedError:
            b = int_wna16.WNA16MoEBackend.MARLIN
            return b, int_wna16.backend_to_kernel_cls(b)[0]
    for mod in (auto_gptq, auto_awq, ct_moe):
        mod.select_wna16_moe_backend = select
    _note("vllm", "layers/fused_moe/oracle/int_wna16.py select_wna16_moe_backend (as auto_gptq.py, "
          "auto_awq.py and compressed_tensors_moe_wna16.py import it)",
          "falls back to the MARLIN backend where it finds none on this CPU (NotImplementedError: "
          "No WNA16 MoE backend supports the deployment configuration): the backend is the "
          "kernel that runs at forward and in process_weights_after_loading; the experts' "
          "parameters are created by create_weights whatever it is")


def _kernel_stub(module, names, why_engine, where, why):
    """A module of kernels that are only called at forward time, each raising
    if called: model building and loading never call them."""
    import sys
    import types

    m = types.ModuleType(module)

    def make(n):
        def stub(*a, **k):
            raise RuntimeError(f"{module}.{n} is a stub of the engine oracle: no forward pass here")
        return stub
    for n in names:
        setattr(m, n, make(n))
    sys.modules[module] = m
    _note(why_engine, where, why)


def apply_sglang():
    # SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1) needs sgl_kernel's CPU build,
    # which PyPI does not carry (the sglang-kernel wheel needs libcuda), so the
    # model is built on SGLang's generic (non-CUDA, non-CPU-engine) path.
    _kernel_stub("vllm._custom_ops", ["rotary_embedding"], "sglang",
                 "layers/rotary_embedding/base.py RotaryEmbedding.__init__",
                 "on a platform that is neither CUDA nor SGLang's CPU engine it imports "
                 "vllm._custom_ops.rotary_embedding as its forward kernel; a stub stands in "
                 "(never called: no forward pass), the cos/sin cache is not in the state dict")
