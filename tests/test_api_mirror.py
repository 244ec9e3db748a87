"""spec, torch_impl and jax_impl export the same losses (every record of the registry, the fused
linear losses included) with the same positional inputs and keyword arguments, and are packages of
the same shape: the same module names, each private function in the module of the same name."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pkgutil

import pytest

from dualloss import losses

CANONICAL = list(losses.ALL_NAMES)
# the class axis default is the one intended difference: torch layout (N, C, ...)
AXIS_DEFAULT = {"spec": -1, "jax_impl": -1, "torch_impl": 1}
# keywords a backend has after the spec's, last and None by default, and why (DESIGN 12: the class
# axis split over devices; a single-device spec has neither): torch_impl names the process group
# (vocab-parallel, issue 29 item 2), jax_impl the mesh axis inside jax.shard_map (issue 29 item 1)
BACKEND_KEYWORDS = {
    ("torch_impl", "softmax_cross_entropy"): ["process_group"],
    ("torch_impl", "softmax_focal_loss"): ["process_group"],
    ("jax_impl", "softmax_cross_entropy"): ["axis_name"],
    ("jax_impl", "softmax_focal_loss"): ["axis_name"],
    # the fused linear losses with the head weight split over the classes (issue 29)
    ("torch_impl", "linear_softmax_cross_entropy"): ["process_group"],
    ("torch_impl", "linear_softmax_focal_loss"): ["process_group"],
    ("jax_impl", "linear_softmax_cross_entropy"): ["axis_name"],
    ("jax_impl", "linear_softmax_focal_loss"): ["axis_name"],
}


def _keyword_only(module_name, name):
    module = importlib.import_module(f"dualloss.{module_name}")
    assert name in getattr(module, "__all__", dir(module)), f"{module_name} does not export {name}"
    parameters = inspect.signature(getattr(module, name)).parameters.values()
    positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    keywords = {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY}
    return positional, keywords


@pytest.mark.parametrize("module_name", ["torch_impl", "jax_impl"])
@pytest.mark.parametrize("name", CANONICAL)
def test_backends_mirror_the_spec_signature(name, module_name):
    spec_positional, spec_keywords = _keyword_only("spec", name)
    positional, keywords = _keyword_only(module_name, name)
    assert positional == spec_positional == list(losses.get(name).inputs)
    extras = BACKEND_KEYWORDS.get((module_name, name), [])
    assert list(keywords) == list(spec_keywords) + extras, f"{module_name}.{name} keywords"
    assert all(keywords.pop(extra) is None for extra in extras)
    for keyword, default in spec_keywords.items():
        if keyword == "axis":
            assert keywords["axis"] == AXIS_DEFAULT[module_name]
            assert default == AXIS_DEFAULT["spec"]
        else:
            assert keywords[keyword] == default, f"{module_name}.{name}({keyword}=...)"


@pytest.mark.parametrize("module_name", ["spec", "torch_impl", "jax_impl"])
def test_every_module_exports_every_registered_loss(module_name):
    module = importlib.import_module(f"dualloss.{module_name}")
    exported = set(getattr(module, "__all__", ()))
    assert set(CANONICAL) <= exported


def test_gradient_functions_are_spec_only():
    jax_impl = importlib.import_module("dualloss.jax_impl")
    assert not [name for name in jax_impl.__all__ if name.endswith("_grad")]


# ----------------------------------------------------------------------------------------------
# Three packages of the same shape: the same module names, and in each module the private functions
# of the spec's module in the same order; extras named here
# ----------------------------------------------------------------------------------------------

PACKAGES = ("spec", "torch_impl", "jax_impl")
# the modules all three packages have: a thing lives in the module of the same name in each
MIRRORED_MODULES = {"_inputs", "softmax", "linear", "sigmoid"}
# the modules one package has and another does not, and why
MODULE_EXTRAS = {
    # the gradients w.r.t. targets and options (`wrt=`) and the judge's per-element terms
    "spec": {"wrt", "intermediates"},
    # the closed-form derivative adapter (autograd.Function), the F.* / nn.*Loss signatures, and
    # the place of the accelerator kernels (DESIGN 11)
    "torch_impl": {"_autodiff", "dropins", "_kernels", "parallel"},
    # the closed-form derivative adapter (custom_jvp); both backends: `global_count` and the
    # collectives past one device (DESIGN 12)
    "jax_impl": {"_autodiff", "parallel"},
}

# what a backend has that the spec does not, and why
BACKEND_EXTRAS = {
    "jax_impl": {
        # logits spanning more than the largest number: -a log p where z - z_top overflowed (the
        # spec computes in float64, where the parity cases' spans do not overflow)
        "_minus_log_p_times", "_far_loss",
        # dtypes and traced values
        "_is_concrete", "_compute_dtype", "_check_traced_indices",
        # wrong-framework input, and options that may be traced (gamma, alpha, label_smoothing)
        "_not_torch", "_is_static", "_scalar_option", "_power",
        # the custom_jvp adapter (closed-form derivative rules)
        "_is_zero", "_forward_tangent", "_closed_form_jvp", "_with_closed_form_grad",
        # XLA:CPU's float64 log1p is inaccurate below -0.3
        "_log1m",
        # XLA flushes subnormals: rows whose other classes are all below the smallest normal
        "_unflush_exponent", "_unflush_power",
        # the gather path for class-index targets
        "_at", "_shifted_sums", "_softmax_focal_terms_at",
        "_softmax_cross_entropy_terms_at",
        # bfloat16 matmuls accumulated in float32 and row blocks sized from the device (linear)
        "_dot", "_split", "_block_budget",
        # closed-form tangents along the targets and alpha (the targets' one exact where
        # 1 - p_t is below the smallest normal: log softplus without underflow)
        "_sigmoid_focal_other_tangent", "_sigmoid_focal_targets_tangent", "_log_softplus",
        # one exp, log1p and divide shared by every sigmoid quantity of the sigmoid losses, and a
        # quotient whose derivative does not overflow for tiny denominators (sigmoid focal r)
        "_sigmoid_parts", "_ratio", "_ratio_jvp",
        # value checks without a host copy of accelerator data (docs/devices.md)
        "_on_host", "_check_alpha_values",
        # the sigmoid focal loss's targets in [0, 1]: raised on the host, NaN elsewhere
        "_sigmoid_focal_targets",
        # optax's arguments (a `where` of the batch shape, a tuple `axis`), for the optax drop-ins
        "_expand_where", "_class_axes_last",
        # the fused linear losses: the block kernel, the row-block scan, the two custom_vjp
        # functions (scalar reductions: gradients in the forward pass; 'none': recomputed) and
        # the NaN cotangent of the inputs they do not differentiate
        "_linear_block", "_linear_chunks", "_nan_like",
        "_linear_sum", "_linear_sum_fwd", "_linear_sum_bwd",
        "_linear_rows", "_linear_rows_fwd", "_linear_rows_bwd",
        # return_aux of a block (its lse and top class; over the slices when split over V)
        "_block_aux",
        # the index-target row sums: the terms times 2^k without a select (squared half-exp),
        # and the target's class weight gathered only for a weight vector
        "_scaled_exp", "_class_weight_at",
        # `normalizer`: the mean's divisor given (the backends divide before the dtype cast),
        # applied to the sigmoid losses' weights (each term divided before summing)
        "_mean_divisor", "_sigmoid_divide",
        # the class axis split over a mesh axis (`axis_name=`, DESIGN 12): the slice's place in
        # the row and the argument handling, the custom_jvp adapter whose tangent psums the
        # slices, and the softmax terms with the row sums reduced over the slices
        "_class_shard", "_sharded_softmax_inputs", "_with_sharded_grad",
        "_sharded_top", "_sharded_log_softmax", "_sharded_sum_except_self",
        "_sharded_focal_terms", "_sharded_softmax",
        # the LLM head options (DESIGN 13): the capped terms (the z-term is the spec's, in
        # ``_softmax_focal_terms``); over a mesh axis, each slice capped and return_aux's
        # reductions
        "_softmax_head_terms", "_sharded_aux", "_capped", "_capped_jvp",
        # the fused linear losses over a mesh axis: what they refuse (as torch_impl's), and their
        # custom_vjp cotangents summed over the mesh axes an input is replicated along
        "_linear_parallel_refuses", "_varying_axes", "_sum_to_type_of",
    },
    "torch_impl": {
        # logits spanning more than the largest number: -a log p where z - z_top overflowed (the
        # spec computes in float64, where the parity cases' spans do not overflow)
        "_minus_log_p_times", "_far_loss",
        # dtypes, index validation and functorch
        "_dtype_name", "_compute_dtype", "_is_index", "_values_are_concrete", "_softmax_targets",
        # torch.autocast runs the losses in float32; the kept elements (ignore_index, `where`)
        "_autocast_float32", "_softmax_keep",
        # the autograd.Function adapter and its in-place rule
        "_ClosedFormGrad", "_with_closed_form_grad", "_inplace", "_frees_saved_tensors",
        "_saved_tensors_are_private",
        # gradients w.r.t. targets, weights and alpha: autograd through the forward formula
        "_other_input_grads",
        # the row statistics shared by the dense and the sparse path, and their log(1 - p)
        "_row_stats", "_log_not_p", "_softmax_focal_terms_sparse", "_softmax_loss_or_grad",
        # the class-index fast path: torch's fused softmax, the gradient from the saved p alone
        "_SoftmaxAtTarget", "_sum_except_target", "_target_rows", "_softmax_at_target",
        "_at_target",
        # fused element-wise kernels and the loss-or-gradient bodies of the sigmoid losses
        "_addcmul", "_sigmoid_cross_entropy_or_grad", "_sigmoid_focal_loss_or_grad",
        # sigma(+-x) in one kernel each, no negated copy (the fast path's two sigmoids)
        "_scaled_sigmoid", "_sigmoids",
        # the sigmoid losses' Function: the sum in forward, NaN gradients at +inf logits, and the
        # focal loss's target gradient in closed form (exact where 1 - p_t is subnormal)
        "_SigmoidLoss", "_posinf_to_nan", "_sigmoid_focal_targets_grad", "_log_softplus",
        # the deprecated size_average/reduce arguments of the torch drop-ins
        "_legacy_reduction",
        # value checks without a host sync on accelerators (docs/devices.md)
        "_reads_on_host", "_check_class_indices", "_check_alpha_values",
        "_check_sigmoid_focal_targets",
        # scalar options under torch.compile, where a float that changes is a symbol
        "_scalar_option", "_gamma", "_unit_interval",
        # no autograd function where nothing asks for a gradient (compiles without one)
        "_asks_for_no_gradient", "_sigmoid_loss",
        # the fused linear losses: the row-block loop, its in-place block kernel, its Function
        "_linear_chunks", "_linear_block", "_LinearSoftmax",
        # return_aux of a block (its lse and top class; over the ranks when split over V)
        "_block_aux",
        # the Triton kernels (DESIGN 11): the selection, whether a call takes them, and the
        # autograd Function over their custom ops, per family; torch.func transforms keep eager
        "_mode", "_missing", "_in_transform",
        "_softmax_takes_triton", "_softmax_triton", "_SoftmaxTriton",
        "_sigmoid_takes_triton", "_sigmoid_triton", "_SigmoidTriton", "_linear_takes_triton",
        # `normalizer`: the mean's divisor given (the backends divide before the dtype cast)
        "_mean_divisor",
        # vocab-parallel (DESIGN 12, `process_group=`): the group, a DTensor's slice and mesh,
        # this rank's first class (parallel); the per-row-collective Function and its caller,
        # and the reductions shared with the single-device path (softmax)
        "_process_group", "_is_dtensor", "_from_dtensor", "_to_dtensor", "_class_slice",
        "_batch_group", "_VocabParallel", "_softmax_vocab_parallel", "_softmax_sharded",
        "_softmax_reduce", "_kept_weight_sum",
        # the LLM head options (DESIGN 13): over a process group, each slice capped (``_SoftCap``),
        # return_aux's statistics and the first top class over the ranks; in the fast path's own
        # passes: the capped logits in one temporary, the cap's derivative as 1 / cosh^2, and
        # logsumexp from the fast path's softmax
        "_SoftCap", "_vocab_parallel_aux", "_first_top",
        # the focal terms of every class over a process group (jax_impl's _sharded_log_softmax
        # and _sharded_focal_terms)
        "_vocab_parallel_log_softmax", "_VocabParallelDense",
        "_capped_logits", "_times_dcap", "_target_lse",
        # the fused linear losses over a process group: what they refuse (as jax_impl's)
        "_linear_parallel_refuses",
    },
}  # fmt: skip
# what the spec has that a backend does not: the judge's per-element intermediates, and the
# closed-form gradients w.r.t. targets and options (`wrt=`), which the backends derive their own way
SPEC_EXTRAS = {
    "_softmax_elements",
    "_check_wrt", "_needs_option", "_times_mass", "_scale_by_reduction", "_sum_to_shape",
    "_softmax_input_grad", "_sigmoid_cross_entropy_input_grad", "_focal_ce_ratio",
    "_sigmoid_focal_input_grad",
    # the fused linear losses: picking one gradient of the spec's dict (`wrt=`)
    "_linear_grad",
    # `normalizer`: the spec divides the reduction='sum' result (loss or any gradient) by it
    "_normalize",
}  # fmt: skip


def _modules(package):
    """The modules of dualloss/<package>/ (files and subpackages), by name."""
    path = pathlib.Path(importlib.import_module(f"dualloss.{package}").__file__).parent
    return {m.name for m in pkgutil.iter_modules([str(path)])}


def _private_functions(package, module):
    """Top-level private functions and classes of dualloss/<package>/<module>.py, in file order."""
    path = pathlib.Path(importlib.import_module(f"dualloss.{package}.{module}").__file__)
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.ClassDef)
    return [n.name for n in tree.body if isinstance(n, kinds) and n.name.startswith("_")]


def _where_defined(package):
    """Private name -> the module of `package` that defines it."""
    where = {}
    for module in sorted(_modules(package)):
        for name in _private_functions(package, module):
            assert name not in where, f"{package}: {name} in {where[name]} and {module}"
            where[name] = module
    return where


@pytest.mark.parametrize("package", PACKAGES)
def test_the_three_packages_have_the_same_modules(package):
    assert _modules(package) == MIRRORED_MODULES | MODULE_EXTRAS[package]


@pytest.mark.parametrize("module", sorted(MIRRORED_MODULES))
@pytest.mark.parametrize("module_name", ["torch_impl", "jax_impl"])
def test_private_functions_mirror_the_spec_in_the_same_order(module_name, module):
    spec_names = _private_functions("spec", module)
    names = _private_functions(module_name, module)
    shared = [name for name in spec_names if name in names]
    assert [name for name in names if name in spec_names] == shared, f"{module_name}.{module} order"


@pytest.mark.parametrize("module_name", ["torch_impl", "jax_impl"])
def test_private_functions_are_where_the_spec_has_them(module_name):
    spec_where = _where_defined("spec")
    where = _where_defined(module_name)
    for name in set(spec_where) & set(where):
        assert where[name] == spec_where[name], f"{module_name}: {name}"
    assert set(where) - set(spec_where) == BACKEND_EXTRAS[module_name], "unlisted extras"
    assert set(spec_where) - set(where) == SPEC_EXTRAS, f"spec functions {module_name} lacks"
