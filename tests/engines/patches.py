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
    apply_vllm_marlin_capability()


def apply_vllm_marlin_capability():
    """Marlin's type check (8-bit GPTQ codes) as on a Hopper GPU."""
    from vllm.model_executor.layers.quantization.utils import marlin_utils

    orig = marlin_utils._check_marlin_supported

    def as_sm90(quant_type, group_size, has_zp, device_capability=None):
        plat = marlin_utils.current_platform
        plat.is_cpu = lambda: False  # only while the type list is read
        try:
            return orig(quant_type, group_size, has_zp, 90)
        finally:
            del plat.is_cpu
    marlin_utils._check_marlin_supported = as_sm90
    _note("vllm", "model_executor/layers/quantization/utils/marlin_utils.py _check_marlin_supported",
          "asks as on a Hopper GPU (capability 90, not the CPU platform's list): on a CPU "
          "query_marlin_supported_quant_types lists only 4-bit codes, so AutoGPTQLinearMethod "
          "refuses 8-bit GPTQ before creating its parameters; the check only selects the kernel "
          "that runs at forward and in process_weights_after_loading")


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
