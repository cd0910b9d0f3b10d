"""The runtimes that load GPTQ checkpoints, as data: for each runtime and version range, the
kernel paths it may take and when, what each path requires of a module, which config key it
reads the convention from, and how it reads the stored zero points. Every rule cites the code
it comes from (repository, file, commit or release). Adding a runtime is one entry in RUNTIMES
plus a fixture that triggers each of its rules (a new way of reading zero points is one entry
in readings.py); reports, `verify --runtime` and the numerical comparisons read everything from
here (verdicts.py applies it to a checkpoint).
"""
from __future__ import annotations

from ..bits.conventions import GPTQ, GPTQ_V2
from ..errors import UsageError
from ..formats.configs import CONFIG_JSON_LABEL as CONFIG_JSON
from ..formats.configs import QUANT_CONFIG, QUANTIZE_CONFIG
from .readings import Reading
from .rules import (
    Citation,
    Facts,
    Path,
    Route,
    Rule,
    Runtime,
    asym_needs_gptqmodel_quantizer,
    bits_in,
    capability_at_least,
    divisible,
    fused_dynamic,
    group_size_in,
    in_features_per_group,
    key_set,
    lm_head_declared,
    no_legacy_key,
    not_lm_head,
    pack_dtype_in,
    parse_version,
    scales_fp16,
    sym_true,
)

# ---------------------------------------------------------------- the table

MARLIN_GROUPS = (-1, 32, 64, 128)
ZERO_V1 = {GPTQ: Reading.V1_NOWRAP, GPTQ_V2: Reading.V2}        # label-aware, s + 1 on gptq
ZERO_V1_ONLY = {GPTQ: Reading.V1_NOWRAP, GPTQ_V2: Reading.V1_NOWRAP}   # label ignored
WRAP_ONLY = {GPTQ: Reading.V1_WRAP, GPTQ_V2: Reading.V1_WRAP}
NO_QZEROS = {GPTQ: Reading.SYMMETRIC, GPTQ_V2: Reading.SYMMETRIC}

# ---- TGI: huggingface/text-generation-inference, maintenance mode since 34988476 (2025-12-11);
# db931fcf (2026-01-08) differs from v3.3.7 (dfb3fbe7) only in a CI workflow.
_TGI = "huggingface/text-generation-inference"
_TGI_REF = "db931fcf42da018a3657580c64bf2720f167f9ab"
_TGI_MARLIN = Citation(_TGI, "server/text_generation_server/layers/marlin/gptq.py", _TGI_REF,
                       "can_use_gptq_marlin L39-52")
_TGI_GPTQ = Citation(_TGI, "server/text_generation_server/layers/gptq/__init__.py", _TGI_REF,
                     "GPTQWeightsLoader.get_weights L120-126, HAS_EXLLAMA L455-476")
_TGI_CONFIG = Citation(_TGI, "server/text_generation_server/utils/quantization.py", _TGI_REF,
                       "_get_quantizer_config L47-121 (sym defaults to False; checkpoint_format "
                       "only for marlin_24)")
_TGI_TRITON = Citation(_TGI, "server/text_generation_server/layers/gptq/triton.py", _TGI_REF,
                       "matmul_248_kernel L184-185 (zeros + 1) & maxq; QuantLinear L263-264")
_TGI_EXL2 = Citation("turboderp/exllamav2", "exllamav2/exllamav2_ext/cuda/q_gemm_kernel_gptq.cuh",
                     "509f9aaca9dd7f553169fb00ba4eb6d64d457616",
                     "v0.1.8 as TGI's CUDA image builds it (server/Makefile-exllamav2): "
                     "zeros[i] + 1, no mask")
_TGI_HEAD = Citation(_TGI, "server/text_generation_server/layers/tensor_parallel.py", _TGI_REF,
                     "TensorParallelHead.load L45-73 reads lm_head.weight only")
def _tgi_marlin_shape(f: Facts) -> str | None:
    k, n = f.in_features, f.out_features
    if k is None or n is None or (k % 128 == 0 and n % 64 == 0) or \
            (k % 64 == 0 and n % 128 == 0):
        return None
    return f"in_features {k}, out_features {n}"


TGI = Runtime(
    "tgi", "TGI", "3.3.x (read: db931fcf = v3.3.7)",
    family="tgi", since=(3, 3), before=(3, 4), read=(3, 3, 7),
    config_files=(CONFIG_JSON, QUANTIZE_CONFIG, QUANT_CONFIG), needs_config=True,
    label_keys=(),
    paths=(
        Path("gptq_marlin", "TGI Marlin",
             when=(capability_at_least(80, _TGI_MARLIN), bits_in((4, 8), _TGI_MARLIN, "config"),
                   group_size_in(MARLIN_GROUPS, _TGI_MARLIN, "config"),
                   sym_true(_TGI_MARLIN, missing="false")),
             requires=(Rule("marlin_shape", "(in % 128 and out % 64) or (in % 64 and out % 128)",
                            _tgi_marlin_shape,
                            Citation(_TGI, "server/text_generation_server/layers/marlin/gptq.py",
                                     _TGI_REF, "_check_valid_shape L474-481")),
                       in_features_per_group(_TGI_MARLIN), not_lm_head(_TGI_HEAD)),
             readings=NO_QZEROS, source=_TGI_MARLIN),
        Path("exllamav2", "TGI exllamav2",
             when=(capability_at_least(80, _TGI_GPTQ), bits_in((4,), _TGI_GPTQ, "config"),
                   Rule("desc_act_false", "desc_act false",
                        lambda f: "desc_act is true" if f.desc_act else None, _TGI_GPTQ,
                        "config")),
             requires=(bits_in((4,), _TGI_GPTQ, rid="module_bits"), not_lm_head(_TGI_HEAD)),
             readings=ZERO_V1_ONLY, source=_TGI_EXL2,
             otherwise="for 4-bit without desc_act where Marlin does not apply (asymmetric, "
                       "or TGI's Marlin kernel not available)"),
        Path("triton", "TGI triton",
             when=(),
             requires=(bits_in((2, 4, 8), _TGI_TRITON), not_lm_head(_TGI_HEAD)),
             readings=WRAP_ONLY, source=_TGI_TRITON,
             otherwise="when neither Marlin nor exllamav2 applies (desc_act, 2/8-bit "
                       "asymmetric, a GPU below compute capability 8.0, DISABLE_EXLLAMA=True)"),
    ),
    requires=(), label_source=_TGI_CONFIG, ignores_dynamic=_TGI_CONFIG)

# ---- SGLang: the git repository was read through its PyPI wheels (they record no commit).
_SGL = "sgl-project/sglang"
_SGL_NEW = "v0.5.23 (wheel sha256 00b3cd5b265ac76c)"
_SGL_OLD = "v0.5.19 (wheel sha256 425e87377e725d03)"


def _sgl(ref: str, where: str, path: str = "python/sglang/srt/layers/quantization/gptq/gptq.py"
         ) -> Citation:
    return Citation(_SGL, path, ref, where)


_SGL_LM = "lm_head quantized only with `lm_head: true` (utils.py get_linear_quant_method)"


def _sglang_marlin(ref: str) -> Path:
    src = _sgl(ref, "is_gptq_marlin_compatible L459-481, TYPE_MAP L298-301")
    return Path(
        "gptq_marlin", "SGLang Marlin",
        when=(capability_at_least(80, _sgl(ref, "GPTQMarlinConfig.get_min_capability L386-387")),
              key_set("sym", src), key_set("desc_act", src),
              bits_in((4, 8), src, "config"), group_size_in(MARLIN_GROUPS, src, "config"),
              sym_true(src, missing="refuse")),
        # the shape check's result is ignored (gptq_kernels.py process_weights_after_loading
        # L89-94): no shape rule here
        requires=(bits_in((4, 8), _sgl(ref, "get_dynamic_override L254-272: a dynamic "
                                        "override outside TYPE_MAP raises"), rid="dynamic_bits"),
                  sym_true(_sgl(ref, "override_config L222-251"), missing="true",
                           scope="module", rid="dynamic_sym"),
                  lm_head_declared(_sgl(ref, _SGL_LM))),
        readings=NO_QZEROS,
        source=_sgl(ref, "GPTQMarlinLinearScheme zero_points=False",
                    "python/sglang/srt/layers/quantization/gptq/schemes/gptq_marlin.py"))


SGLANG = Runtime(
    "sglang", "SGLang", ">= 0.5.20 (read: 0.5.23)",
    family="sglang", since=(0, 5, 20), read=(0, 5, 23),
    config_files=(CONFIG_JSON, QUANTIZE_CONFIG), needs_config=True,
    label_keys=("checkpoint_format",),
    paths=(_sglang_marlin(_SGL_NEW),),
    requires=(), label_source=_sgl(_SGL_NEW, "from_config L155-157"),
    next_step="SGLang >= 0.5.20 has no non-Marlin GPTQ kernel on CUDA (\"The non-Marlin GPTQ "
              "CUDA kernel has been removed\"): use a 4/8-bit symmetric checkpoint, or another "
              "format")
SGLANG_GPTQ_GEMM = Runtime(
    "sglang-gptq-gemm", "SGLang (gptq_gemm)", "<= 0.5.19 (read: 0.5.19)",
    family="sglang", before=(0, 5, 20), read=(0, 5, 19),
    config_files=(CONFIG_JSON, QUANTIZE_CONFIG), needs_config=True,
    label_keys=(),   # use_v2_format is computed but never passed to sgl_kernel.gptq_gemm
    paths=(_sglang_marlin(_SGL_OLD),
           Path("gptq_gemm", "SGLang gptq_gemm", when=(),
                requires=(lm_head_declared(_sgl(_SGL_OLD, _SGL_LM)),),
                readings=ZERO_V1_ONLY,
                otherwise="when gptq_marlin's conditions fail, or with --quantization gptq",
                source=Citation(_SGL, "sgl-kernel/csrc/gemm/gptq/gptq_kernel.cu",
                                "033190958f171730e5850f8843ea99add9d1db78",
                                "zeros[i] + 1, no use_v2_format argument"))),
    requires=(key_set("desc_act", _sgl(_SGL_OLD, "GPTQConfig.from_config L151-153")),),
    label_source=_sgl(_SGL_OLD, "gptq_kernels.py L117-125: the 7-argument gptq_gemm",
                      "python/sglang/srt/hardware_backend/gpu/quantization/gptq_kernels.py"))

# ---- ExLlamaV2: turboderp/exllamav2 b9c025b4 (v0.2.7+4); the GPTQ path is the same in 0.3.2.
_EXL = "turboderp/exllamav2"
_EXL_REF = "b9c025b4b1ee78c0d34e700f2e474a02dfb13c90"
_EXL_SHAPES = Citation(_EXL, "exllamav2/exllamav2_ext/ext_qmatrix.cpp", _EXL_REF,
                       "make_q_matrix L66-69: height = qweight rows * 8, qzeros columns = out / 8")
EXLLAMAV2 = Runtime(
    "exllamav2", "ExLlamaV2", "0.1.8-0.3.2 (read: b9c025b4)",
    family="exllamav2", since=(0, 1, 8), read=(0, 3, 2),
    config_files=(CONFIG_JSON,), needs_config=False,
    label_keys=("checkpoint_format",),
    paths=(Path("exllamav2", "ExLlamaV2", when=(),
                requires=(bits_in((4,), _EXL_SHAPES),
                          pack_dtype_in(("int32",), Citation(
                              _EXL, "exllamav2/exllamav2_ext/ext_qmatrix.cpp", _EXL_REF,
                              "L38-48: qweight, qzeros, g_idx int32")),
                          Rule("group_size_pow2", "group_size a power of two (it is inferred as "
                               "the smallest power of two covering in_features / groups)",
                               lambda f: None if f.group_size in (None, -1) or
                               f.group_size & (f.group_size - 1) == 0 else
                               f"group_size is {f.group_size}",
                               Citation(_EXL, "exllamav2/exllamav2_ext/cuda/q_matrix.cu", _EXL_REF,
                                        "QMatrix L103-104"))),
                readings={GPTQ: Reading.V1_NOWRAP, GPTQ_V2: Reading.V2_BORROW},
                source=Citation(_EXL, "exllamav2/exllamav2_ext/cuda/q_gemm_kernel_gptq.cuh",
                                _EXL_REF, "L169 zeros[i] + 1; ext.py L366-367 subtracts "
                                "0x11111111 from gptq_v2 qzeros words")),),
    requires=(), label_source=Citation(_EXL, "exllamav2/config.py", _EXL_REF,
                                       "L394-395 quantization_config->checkpoint_format"),
    ignores_dynamic=Citation(_EXL, "exllamav2/config.py", _EXL_REF,
                             "GPTQ layers found by .qweight; no quantization key but "
                             "checkpoint_format is read"))

# ---- GPTQModel: ModelCloud/GPTQModel f4c327a1 (v7.3.4+1), its own loader. Checked again in the
# 7.7.0 sdist (PyPI): the config files it reads and their order (quantization/config.py L79-80,
# from_pretrained L4102-4107), the is_marlin_format refusal (L3933-3936) and the asymmetric-v1
# guard (models/loader.py L2100-2103) are unchanged; its torch kernel decodes gptqfmt's
# conversions and relabels bit-identically on a CPU (scripts/peer_acceptance.py).
_GQM = "ModelCloud/GPTQModel"
_GQM_REF = "f4c327a17eb3e24524d5a97a3d682e3696ae6a28"


def _gqm(path: str, where: str) -> Citation:
    return Citation(_GQM, path, _GQM_REF, where)


_GQM_CONVERT = _gqm("gptqmodel/utils/model.py", "convert_gptq_v1_to_v2_format L750-845: "
                    "qzeros += 0x11111111 (4-bit) on int32 words")
V2_KERNEL = {GPTQ: Reading.V1_CARRY, GPTQ_V2: Reading.V2}


def _gptqmodel_paths(prefix: str) -> tuple[Path, ...]:
    q = "gptqmodel/nn_modules/qlinear/"
    return (
        Path("machete", f"{prefix} Machete",
             when=(capability_at_least(90, _gqm(q + "machete.py", "L39-59")),
                   bits_in((4, 8), _gqm(q + "machete.py", "L39-59"), "config"),
                   group_size_in((-1, 64, 128), _gqm(q + "machete.py", "L39-59"), "config")),
             requires=(divisible("in_features", 64, _gqm(q + "machete.py", "L39-59"), "Machete"),
                       divisible("out_features", 128, _gqm(q + "machete.py", "L39-59"),
                                 "Machete")),
             readings=V2_KERNEL, source=_GQM_CONVERT),
        Path("marlin", f"{prefix} Marlin",
             when=(bits_in((4, 8), _gqm(q + "marlin.py", "L55-85"), "config"),
                   group_size_in(MARLIN_GROUPS, _gqm(q + "marlin.py", "L55-85"), "config"),
                   sym_true(_gqm(q + "marlin.py", "TYPE_MAP L81-85"), missing="true")),
             requires=(divisible("out_features", 64, _gqm(q + "marlin.py", "L55-85"), "Marlin"),),
             readings=NO_QZEROS, source=_gqm(q + "marlin.py", "post_init L285 empties qzeros")),
        Path("exllamav2", f"{prefix} exllamav2",
             when=(bits_in((4,), _gqm(q + "exllamav2.py", "L35-58"), "config"),
                   group_size_in(MARLIN_GROUPS, _gqm(q + "exllamav2.py", "L35-58"), "config")),
             requires=(divisible("in_features", 32, _gqm(q + "exllamav2.py", "L35-58"),
                                 "exllamav2"),
                       divisible("out_features", 32, _gqm(q + "exllamav2.py", "L35-58"),
                                 "exllamav2")),
             readings=V2_KERNEL, source=_GQM_CONVERT),
        Path("triton", f"{prefix} triton",
             when=(bits_in((2, 4, 8), _gqm(q + "tritonv2.py", "L53-75"), "config"),),
             requires=(divisible("in_features", 32, _gqm(q + "tritonv2.py", "L53-75"), "triton"),
                       divisible("out_features", 32, _gqm(q + "tritonv2.py", "L53-75"),
                                 "triton")),
             readings=V2_KERNEL, source=_GQM_CONVERT),
        Path("torch", f"{prefix} torch", when=(),
             requires=(), readings=V2_KERNEL, source=_GQM_CONVERT),
    )


# GPTQModel reads the first of these that exists (quantization/config.py L74,
# QuantizeConfig.from_pretrained L3022-3045)
_GQM_FILES = (QUANTIZE_CONFIG, QUANT_CONFIG, CONFIG_JSON)
GPTQMODEL = Runtime(
    "gptqmodel", "GPTQModel", "7.x (read: f4c327a1)",
    family="gptqmodel", since=(7,), read=(7, 3, 4),
    config_files=_GQM_FILES, needs_config=True,
    label_keys=("format", "checkpoint_format"),
    paths=_gptqmodel_paths("GPTQModel"),
    # in the order it checks them: the config is parsed before the model is built
    requires=(
        # the key alone is refused, `false` too (AutoGPTQ 0.7.1 writes false); from
        # 96ff08b38e11 (#2456), first tag v6.0.0 (v5.8.0 still accepted it)
        no_legacy_key("is_marlin_format", _GQM_FILES, _gqm(
            "gptqmodel/quantization/config.py", "from_quant_config L2855-2858: "
            "\"`is_marlin_format` is no longer supported. Replace it with an explicit `format` "
            "field.\""), since=(6, 0), runtime="GPTQModel").with_hint(
            "next step: `gptqfmt fix-label PATH` removes is_marlin_format (AutoGPTQ writes it "
            "false; GPTQModel 6.0 and later refuse the key whatever its value)"),
        asym_needs_gptqmodel_quantizer(_gqm("gptqmodel/models/loader.py",
                                            "from_quantized L1658-1663"))),
    label_source=_gqm("gptqmodel/quantization/config.py",
                      "from_quant_config L2824-2923: format wins, checkpoint_format is a "
                      "deprecated alias"))

# ---- transformers >= 5.0: GPTQConfig -> optimum -> GPTQModel (hf_select_quant_linear)
_HF = "huggingface/transformers"
_HF_REF = "v5.24.0 (PyPI wheel)"
TRANSFORMERS = Runtime(
    "transformers", "transformers (GPTQModel backend)", ">= 5.0 (read: 5.24.0)",
    family="transformers", since=(5, 0), read=(5, 24, 0),
    config_files=(CONFIG_JSON,), needs_config=True,
    label_keys=("checkpoint_format", "format"),
    paths=tuple(
        Path(p.kernel, p.label.replace("GPTQModel", "transformers"), p.when,
             p.requires + (not_lm_head(Citation(
                 "huggingface/optimum", "optimum/gptq/quantizer.py",
                 "83c88b8fc51e791f263a954e3568e1d2a02aa003",
                 "convert_model L253-279: only the blocks' layers are replaced")),),
             p.readings, p.source)
        for p in _gptqmodel_paths("GPTQModel")),
    requires=(), label_source=Citation(_HF, "src/transformers/utils/quantization_config.py",
                                       _HF_REF, "GPTQConfig.__init__ L718: checkpoint_format "
                                       "overrides format"))

# ---- AutoGPTQ 0.7.1 (from_quantized defaults: exllamav2 for 4-bit, else cuda_old / cuda)
_AG = "AutoGPTQ/AutoGPTQ"
_AG_REF = "b8b41270f3dd5d657aee049d7b64538ab5dd244e"


def _ag(path: str, where: str) -> Citation:
    return Citation(_AG, path, _AG_REF, where)


_AG_NOT_EXLLAMA = "for 4-bit only with the exllama kernels disabled or unavailable"
NIBBLE_ONLY = {GPTQ: Reading.V1_NIBBLE, GPTQ_V2: Reading.V1_NIBBLE}
_AG_SELECT = _ag("auto_gptq/utils/import_utils.py", "dynamically_import_QuantLinear L59-99")
_AG_CUDA_OLD = Rule("cuda_old", "desc_act false or group_size -1 (desc_act missing: true)",
                    lambda f: None if f.desc_act is False or f.group_size == -1 else
                    f"desc_act is {f.desc_act if f.desc_act is not None else 'not set (true)'}",
                    _AG_SELECT, "config")
_AG_SWITCH = _ag("auto_gptq/nn_modules/qlinear/qlinear_cuda.py",
                 "forward: kernel_switch_threshold = 128")
_AG_DECODE = Rule("rows_below_128", "fewer than 128 rows per forward (decoding; in and out "
                  "multiples of 64, else the torch path)",
                  lambda f: None if f.rows < 128 else f"{f.rows} rows", _AG_SWITCH, "setup")
_AG_PREFILL = Rule("rows_128", "128 rows or more per forward (prefill)",
                   lambda f: None if f.rows >= 128 else f"{f.rows} rows", _AG_SWITCH, "setup")
_AG_EXT = _ag("autogptq_extension/cuda_256/autogptq_cuda_kernel_256.cu",
              "L550, L637: ((zeros >> shift) & mask) + 1) & 0x0f, a 4-bit mask at every bits "
              "(since 6c276a3)")

AUTOGPTQ = Runtime(
    "autogptq", "AutoGPTQ", "0.7.1 (read: b8b41270)",
    family="autogptq", since=(0, 7, 1), before=(0, 7, 2), read=(0, 7, 1),
    config_files=(QUANTIZE_CONFIG, QUANT_CONFIG, CONFIG_JSON), needs_config=True,
    label_keys=(),
    paths=(
        Path("exllamav2", "AutoGPTQ exllamav2",
             when=(bits_in((4,), _AG_SELECT, "config"),),
             requires=(divisible("in_features", 32, _ag(
                 "auto_gptq/nn_modules/qlinear/qlinear_exllamav2.py", "L113-135"), "exllamav2"),
                       divisible("out_features", 32, _ag(
                           "auto_gptq/nn_modules/qlinear/qlinear_exllamav2.py", "L113-135"),
                           "exllamav2"),
                       in_features_per_group(_ag(
                           "auto_gptq/nn_modules/qlinear/qlinear_exllamav2.py", "L113-135"))),
             readings=WRAP_ONLY,
             source=_ag("autogptq_extension/exllamav2/cuda/q_gemm_kernel_gptq.cuh",
                        "L128-131 (zeros[i] + 1) & 0x0f")),
        Path("cuda_old-ext", "AutoGPTQ cuda_old (extension)",
             when=(_AG_CUDA_OLD, _AG_DECODE),
             requires=(),
             readings=NIBBLE_ONLY, source=_AG_EXT, otherwise=_AG_NOT_EXLLAMA),
        Path("cuda_old-torch", "AutoGPTQ cuda_old",
             when=(_AG_CUDA_OLD, _AG_PREFILL),
             requires=(),
             readings=WRAP_ONLY, otherwise=_AG_NOT_EXLLAMA,
             source=_ag("auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py",
                        "L296-304: (zeros + 1) & maxq")),
        Path("cuda-ext", "AutoGPTQ cuda (extension)", when=(_AG_DECODE,),
             requires=(),
             readings=NIBBLE_ONLY, source=_AG_EXT, otherwise=_AG_NOT_EXLLAMA),
        Path("cuda-torch", "AutoGPTQ cuda", when=(_AG_PREFILL,),
             requires=(),
             readings=ZERO_V1_ONLY, otherwise=_AG_NOT_EXLLAMA,
             source=_ag("auto_gptq/nn_modules/qlinear/qlinear_cuda.py",
                        "L257-265: (zeros & maxq) + 1")),
    ),
    requires=(), label_source=_ag("auto_gptq/modeling/_base.py",
                                  "BaseQuantizeConfig L81-95: no checkpoint_format field"),
    ignores_dynamic=_ag("auto_gptq/modeling/_base.py", "BaseQuantizeConfig L81-95: no dynamic"))

# ---- llama.cpp convert_hf_to_gguf.py: dequantizes GPTQ to float, then writes GGUF
_LCPP = Citation("ggml-org/llama.cpp", "convert_hf_to_gguf.py",
                 "0024aa7417efd50a7c2a79e049dfbbbceb0beaaf", "ModelBase.dequant_model.dequant_gptq")
LLAMA_CPP = Runtime(
    "llama.cpp", "llama.cpp convert_hf_to_gguf.py", "read: 0024aa74",
    family="llama.cpp",
    config_files=(CONFIG_JSON,), needs_config=True,
    label_keys=("checkpoint_format",),
    paths=(Path("dequant_gptq", "llama.cpp convert", when=(),
                requires=(Rule("bits", "bits in {2, 4, 8} (3-bit: NotImplementedError)",
                               lambda f: None if f.bits is None or f.bits in (2, 4, 8)
                               else f"bits is {f.bits}", _LCPP),
                           Rule("g_idx", "g_idx present for every quantized layer",
                                lambda f: "no g_idx tensor" if f.has_g_idx is False else None,
                                _LCPP)),
                readings=ZERO_V1, source=_LCPP),),
    requires=(), label_source=Citation(
        "ggml-org/llama.cpp", "convert_hf_to_gguf.py", "0024aa7417efd50a7c2a79e049dfbbbceb0beaaf",
        "dequant_gptq: zeros += 1 only if checkpoint_format (default gptq) == \"gptq\""),
    ignores_dynamic=None)

# ---- vLLM: vllm-project/vllm, read in its PyPI wheels (the build commit is in _version.py).
# PR 26092 (gptq_gemm reads checkpoint_format == "gptq_v2") is first in v0.11.1; v0.21.0 is the
# last release with gptq.py and gptq_marlin.py; v0.22.0 has only auto_gptq.py (PR 38288).
_VLLM = "vllm-project/vllm"
_V11 = "v0.11.0 (f71952c1c)"
_V21 = "v0.21.0 (ad7125a43)"
_V33 = "v0.33.0 (4ba787ec9)"
_Q = "vllm/model_executor/layers/quantization/"


def _vl(ref: str, path: str, where: str) -> Citation:
    return Citation(_VLLM, _Q + path, ref, where)


def _vllm_marlin_shape(f: Facts) -> str | None:
    k, n, bits = f.in_features, f.out_features, f.bits
    if k is None or n is None or bits is None or (n % 64 == 0 and k % 128 == 0) or \
            (f.scale_dtype == "F16" and n % (32 // bits) == 0):
        return None
    return f"in_features {k}, out_features {n}, scales {f.scale_dtype}"


def _vllm_marlin(ref: str, capability: int) -> Path:
    src = _vl(ref, "gptq_marlin.py", "is_gptq_marlin_compatible; TYPE_MAP (4, sym) uint4b8, "
              "(8, sym) uint8b128")
    utils = _vl(ref, "utils/marlin_utils.py", "verify_marlin_supports_shape")
    return Path(
        "gptq_marlin", "vLLM gptq_marlin",
        when=(capability_at_least(capability, _vl(ref, "utils/marlin_utils.py",
                                                  "check_marlin_supported")),
              key_set("sym", src), bits_in((4, 8), src, "config"),
              group_size_in(MARLIN_GROUPS, src, "config"), sym_true(src, missing="refuse")),
        requires=(
            Rule("marlin_shape", "out_features % 64 and in_features % 128 (Marlin), else the "
                 "float16 Exllama kernel: out_features % (32 / bits)",
                 _vllm_marlin_shape, _vl(ref, "kernels/mixed_precision/__init__.py",
                                         "choose_mp_linear_kernel: \"Failed to find a kernel "
                                         "that can implement the WNA16 linear layer\"")),
            in_features_per_group(utils),
            bits_in((4, 8), _vl(ref, "utils/gptq_utils.py", "dynamic overrides: "
                                "\"Unsupported quantization config\""), rid="dynamic_bits"),
            lm_head_declared(_vl(ref, "utils/gptq_utils.py", "get_linear_quant_method: "
                                 "lm_head quantized only with `lm_head: true`")),
            _vllm_int32(ref)),
        readings=NO_QZEROS,
        source=_vl(ref, "kernels/mixed_precision/marlin.py", "zero_points=False: qzeros "
                   "replaced by an empty tensor (Exllama: synthetic 2^(bits-1) - 1)"))


def _vllm_gptq_gemm(ref: str, readings: dict, where: str) -> Path:
    src = _vl(ref, "gptq.py", where)
    return Path(
        "gptq_gemm", "vLLM gptq_gemm", when=(),
        # bits 2/3/4/8 ("only 2/3/4/8-bit weight quantization") and out_features a multiple of
        # Fraction(32, bits).numerator hold for every module gptqfmt reads (GPTQ's packing)
        requires=(in_features_per_group(_vl(ref, "gptq.py", "create_weights: \"not aligned "
                                            "with the quantized weight shape\"")),
                  scales_fp16(_vl(ref, "gptq.py", "get_supported_act_dtypes: [torch.half]")),
                  lm_head_declared(_vl(ref, "utils/gptq_utils.py", "get_linear_quant_method")),
                  _vllm_int32(ref)),
        readings=readings, source=src,
        otherwise="when gptq_marlin's conditions fail (e.g. a GPU below its compute capability), "
                  "or with --quantization gptq")


_VLLM_DESC_ACT = key_set("desc_act", Citation(_VLLM, _Q + "gptq.py", _V21,
                                              "from_config: \"Cannot find any of ['desc_act']\""))


def _vllm_fused(ref: str) -> Rule:
    return fused_dynamic(_vl(ref, "utils/gptq_utils.py", "get_dynamic_override: re.match on "
                             "the vLLM layer prefix (qkv_proj, gate_up_proj; "
                             "models/llama.py packed_modules_mapping)"))


def _vllm_int32(ref: str) -> Rule:
    return pack_dtype_in(("int32",), _vl(ref, "gptq.py" if ref != _V33 else "auto_gptq.py",
                                         "create_weights: qweight and qzeros int32, pack "
                                         "factor 32 / bits"))
_VLLM_CONFIG_NOTE = ("vLLM detects the method from config.json's quantization_config; it reads "
                     "quantize_config.json only when --quantization gptq is given")

_VLLM_NEXT = ("next step: vLLM >= 0.22 loads GPTQ only as 4/8-bit symmetric; for asymmetric "
              "or 2/3-bit weights, `gptqfmt convert {PATH} {PATH}-ct --to compressed-tensors` "
              "(vLLM >= 0.31 reads it), or serve gptq_v2 data with --quantization humming "
              "(`gptqfmt doctor {PATH} --runtime vllm-humming`)")
_VLLM_SET_KEY = ("next step: set the missing key in config.json's quantization_config (the "
                 "value the data show: gptqfmt inspect)")

VLLM = Runtime(
    "vllm", "vLLM", ">= 0.22 (read: 0.33.0)",
    family="vllm", since=(0, 22), read=(0, 33, 0),
    config_files=(CONFIG_JSON,), needs_config=True, label_keys=(),
    paths=(Path(
        "marlin", "vLLM Marlin",
        when=(capability_at_least(75, _vl(_V33, "auto_gptq.py", "verify_marlin_supported: "
                                          "\"Marlin does not support weight_bits\"")),),
        requires=(bits_in((4, 8), _vl(_V33, "utils/gptq_utils.py", "dynamic overrides: "
                                      "\"Unsupported quantization config\""), rid="dynamic_bits"
                          ).with_hint(_VLLM_NEXT),
                  sym_true(_vl(_V33, "utils/gptq_utils.py", "dynamic overrides"), missing="true",
                           scope="module", rid="dynamic_sym").with_hint(_VLLM_NEXT),
                  lm_head_declared(_vl(_V33, "utils/gptq_utils.py", "get_linear_quant_method")),
                  _vllm_int32(_V33)),
        readings=NO_QZEROS,
        source=_vl(_V33, "auto_gptq.py", "create_weights L389-435: qzeros loaded, never used "
                   "(zero_points=False)")),),
    requires=(key_set("sym", _vl(_V33, "auto_gptq.py", "from_config L196-197: \"Cannot find "
                                 "any of ['sym']\"")).with_hint(_VLLM_SET_KEY),
              key_set("desc_act", _vl(_V33, "auto_gptq.py", "from_config L196-197")
                      ).with_hint(_VLLM_SET_KEY),
              bits_in((4, 8), _vl(_V33, "auto_gptq.py", "__init__ L153-155: \"Unsupported "
                                  "quantization config: bits=..., sym=...\""), "config"
                      ).with_hint(_VLLM_NEXT),
              sym_true(_vl(_V33, "auto_gptq.py", "__init__ L153-155"), missing="refuse"
                       ).with_hint(_VLLM_NEXT),
              group_size_in(MARLIN_GROUPS, _vl(_V33, "utils/marlin_utils.py",
                                               "MARLIN_SUPPORTED_GROUP_SIZES"), "config"),
              Rule("desc_act_grouped", "no desc_act with group_size != -1 (since 0.30)",
                   lambda f: "desc_act is true with group_size "
                   f"{f.group_size}" if f.desc_act and f.group_size not in (None, -1) else None,
                   _vl(_V33, "utils/gptq_utils.py", "L29-37 (from v0.30.0, ced6857af): "
                       "\"GPTQ group activation ordering (desc_act=True) is no longer "
                       "supported\"; with group_size -1 desc_act is dropped; g_idx is never "
                       "loaded (base_config.py L255-259 maps .g_idx to None)"), "config",
                   since=(0, 30)).with_hint(
                  "next step: where every g_idx is arange(K) // group_size, `gptqfmt fix-label "
                  "{PATH}` sets desc_act false (lossless); a g_idx that reorders is served by "
                  "vLLM 0.22-0.29 (`gptqfmt doctor {PATH} --runtime vllm@0.29`), and no "
                  "compressed-tensors conversion helps (vLLM refuses actorder group too)"),
              _vllm_fused(_V33)),
    label_source=_vl(_V33, "auto_gptq.py", "neither checkpoint_format nor format is read"),
    config_note=_VLLM_CONFIG_NOTE)

VLLM_GPTQ_GEMM = Runtime(
    "vllm-gptq-gemm", "vLLM (gptq_gemm)", "0.11.1-0.21.0 (read: 0.21.0)",
    family="vllm", since=(0, 11, 1), before=(0, 22), read=(0, 21, 0),
    config_files=(CONFIG_JSON,), needs_config=True, label_keys=("checkpoint_format",),
    paths=(_vllm_marlin(_V21, 75),
           _vllm_gptq_gemm(_V21, ZERO_V1, "GPTQLinearMethod: use_v2_format = checkpoint_format "
                           "== \"gptq_v2\"; q_gemm.cu zero = s + (use_v2_format ? 0 : 1)")),
    requires=(_VLLM_DESC_ACT, _vllm_fused(_V21)),
    label_source=_vl(_V21, "gptq.py", "from_config L158-160 checkpoint_format; "
                     "use_v2_format L242 (exact match)"),
    config_note=_VLLM_CONFIG_NOTE)

VLLM_LEGACY = Runtime(
    "vllm-legacy", "vLLM (legacy)", "<= 0.11.0 (read: 0.11.0)",
    family="vllm", before=(0, 11, 1), read=(0, 11, 0),
    config_files=(CONFIG_JSON,), needs_config=True, label_keys=(),
    paths=(_vllm_marlin(_V11, 80),
           _vllm_gptq_gemm(_V11, ZERO_V1_ONLY, "apply: ops.gptq_gemm with 7 arguments, no "
                           "format flag (s + 1)")),
    requires=(key_set("desc_act", _vl(_V11, "gptq.py", "from_config")), _vllm_fused(_V11)),
    label_source=_vl(_V11, "gptq.py", "no checkpoint_format for GPTQ"),
    config_note=_VLLM_CONFIG_NOTE)

# ---- vLLM --quantization humming: vllm/model_executor/layers/quantization/humming.py (from
# v0.20.0, b8160878f), with the humming-kernels wheel vLLM pins (0.33.0: 0.1.19, g452e0bb15;
# the inclusionAI/humming repository mirror is older than the wheels). Chosen only by the flag
# (humming.py L191); its GPTQ schema has no checkpoint_format and takes qzeros as Z.
_HUM = "inclusionAI/humming"
_HUM_REF = "humming-kernels 0.1.19 (g452e0bb15)"


def _hum(path: str, where: str) -> Citation:
    return Citation(_HUM, path, _HUM_REF, where)


STORED_AS_Z = {GPTQ: Reading.V2, GPTQ_V2: Reading.V2}   # label ignored: Z = s
VLLM_HUMMING = Runtime(
    "vllm-humming", "vLLM (--quantization humming)", ">= 0.20 (read: 0.33.0)",
    config_files=(CONFIG_JSON,), needs_config=True, label_keys=(),
    paths=(Path(
        "humming", "vLLM Humming",
        when=(capability_at_least(75, _vl(_V33, "humming.py", "get_min_capability L167-168")),),
        requires=(Rule("humming_group", "group_size >= 16 (-1 is not handled)",
                       lambda f: None if f.group_size is None or f.group_size >= 16 else
                       f"group_size is {f.group_size}",
                       _hum("humming/schema/humming.py", "is_humming_schema_compatible L589 "
                            "refuses 0 < group_size < 16; schema/gptq.py L42 scales "
                            "(K // group_size, N), no case for -1")),
                  not_lm_head(_vl(_V33, "humming.py", "L213: lm_head is always skipped")),
                  _vllm_int32(_V33)),
        readings=STORED_AS_Z,
        source=_hum("humming/schema/gptq.py", "L106-109 zero_point = qzeros, no + 1; "
                    "utils/weight.py L206-207 weight - zero_point")),),
    requires=(Rule("humming_desc_act", "desc_act false (an assert, also with group_size -1)",
                   lambda f: "desc_act is true" if f.desc_act else None,
                   _hum("humming/schema/gptq.py", "to_humming_schema L81: assert not "
                        "self.desc_act (after the weights load)"), "config").with_hint(
                  "next step: where every g_idx is arange(K) // group_size, `gptqfmt fix-label "
                  "{PATH}` sets desc_act false (lossless)"),),
    label_source=_hum("humming/schema/gptq.py", "GPTQWeightSchema L11-17: quant_method, bits, "
                      "group_size, desc_act, sym; no checkpoint_format"),
    family="vllm-humming", since=(0, 20), read=(0, 33, 0))

RUNTIMES = (VLLM, VLLM_GPTQ_GEMM, VLLM_LEGACY, VLLM_HUMMING, SGLANG, SGLANG_GPTQ_GEMM,
            EXLLAMAV2, TGI, TRANSFORMERS, GPTQMODEL, AUTOGPTQ, LLAMA_CPP)
BY_ID = {r.id: r for r in RUNTIMES}

# The formats a runtime family reads where its GPTQ path does not serve (doctor's plan).
_CT = "compressed_tensors/"
COMPRESSED_TENSORS_ROUTES = {"vllm": Route(
    "vllm", "compressed-tensors", "vLLM >= 0.31 (compressed-tensors)",
    "WNA16 with zero points: Marlin at 4/8 bits, Humming at 2/3 bits; the zero points are "
    "stored exactly, so there is no convention to misread", since=(0, 31),
    requires=(Rule("ct_actorder", "no act-order (compressed-tensors actorder group is refused "
                   "since 0.30)", lambda f: "a g_idx that reorders (act-order)" if f.act_order
                   else None, _vl(_V33, _CT + "compressed_tensors.py", "L336-346: \"group/"
                                  "dynamic activation ordering ... is no longer supported\""),
                   "config"),
              Rule("ct_bits", "bits 2-8 (asymmetric below 4/8 bits from 0.31)",
                   lambda f: None if f.bits is None or 2 <= f.bits <= 8 else
                   f"bits is {f.bits}", _vl(_V33, _CT + "schemes/compressed_tensors_wNa16.py",
                                            "WNA16_ZP_SUPPORTED_TYPES_MAP L50-58"), "config")))}


def family_entries(family: str) -> list[Runtime]:
    """The table's entries for one runtime as users name it ("vllm"), oldest first."""
    return sorted((r for r in RUNTIMES if r.family == family),
                  key=lambda r: r.since or (0,))


def resolve(spec: str) -> tuple[Runtime, tuple[int, ...] | None, list[str]]:
    """The entry for `--runtime ID[@VERSION]` (case-insensitive): an entry's id, or a
    family ("vllm": its newest entry, or the one whose versions cover VERSION), the version
    judged (None: the entry as read) and notes (a version newer than the code read). A name
    or version the table does not know is a UsageError that lists what it knows."""
    name, at, ver = spec.strip().partition("@")
    name = name.strip().lower()
    entries = family_entries(name) or ([BY_ID[name]] if name in BY_ID else [])
    if not entries:
        families = sorted({r.family for r in RUNTIMES})
        raise UsageError(f"--runtime {spec!r}: not a runtime the table knows; runtimes: "
                         f"{', '.join(families)} (or an entry: "
                         f"{', '.join(r.id for r in RUNTIMES if r.id not in families)}), each "
                         "with an optional @VERSION")
    if not at:
        return (BY_ID[name] if name in BY_ID else entries[-1]), None, []
    version = parse_version(ver)
    if not ver.strip() or not ver.strip().lstrip("vV")[:1].isdigit():
        raise UsageError(f"--runtime {spec!r}: expected a version after @, e.g. {name}@0.25")
    if entries[0].family == "llama.cpp":
        return entries[0], None, [f"llama.cpp has no release numbers in the table (read at a "
                                  f"commit): judged as read, not as {ver}"]
    cover = [e for e in entries if e.covers(version)]
    if not cover:
        raise UsageError(f"--runtime {spec!r}: the table knows {name} "
                         + "; ".join(f"{e.versions} ({e.id})" for e in entries))
    e = cover[-1]
    notes = []
    if e.read is not None and version > e.read:
        notes.append(f"{e.name} {ver} is newer than the code the table was read at "
                     f"({'.'.join(map(str, e.read))}): judged by that code")
    return e, version, notes
