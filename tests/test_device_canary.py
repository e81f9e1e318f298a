"""Canaries for the private PyTorch APIs and behaviours the simulated device rests on.

The device is pinned to torch 2.13. Each test states one fact the device relies on;
when a PyTorch upgrade breaks one, the failing test names what to adapt (and where).
"""

import inspect

import pytest
import torch

import tilescope.device as dev

dev.register()


def test_privateuse1_registration_apis():
    # _registration.register
    for name in ("rename_privateuse1_backend", "generate_methods_for_privateuse1_backend"):
        assert callable(getattr(torch.utils, name))
    assert "for_storage" in inspect.signature(torch.utils.generate_methods_for_privateuse1_backend).parameters
    assert callable(torch._register_device_module)
    assert torch._C._get_privateuse1_backend_name() == "sim"
    assert torch.sim is not None and hasattr(torch.Tensor, "is_sim")


def test_dispatcher_introspection():
    # _registration._register_kernels enumerates ops and their kernels
    names = torch._C._dispatch_get_all_op_names()
    assert "aten::add.Tensor" in names and len(names) > 2000
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has("aten::add.Tensor", "CompositeExplicitAutogradNonFunctional")  # structured: empty + add.out
    assert has("aten::native_layer_norm", "CompositeExplicitAutograd") and has("aten::native_layer_norm", "CPU")
    assert has("aten::_foreach_add_.Scalar", "CompositeExplicitAutograd")
    assert has("aten::rms_norm", "CompositeImplicitAutograd") and has("aten::layer_norm", "CompositeImplicitAutograd")


def test_op_schema_fields_used_by_handlers():
    # _dispatch.Handler reads these schema fields and their string forms
    s = torch.ops.aten.add_.Tensor._schema
    self_arg, other, alpha = s.arguments
    assert self_arg.alias_info.is_write and other.alias_info is None and alpha.kwarg_only
    assert str(alpha.type) == "number" and str(other.type) == "Tensor"
    assert str(torch.ops.aten.clamp.default._schema.arguments[1].type) == "Optional[number]"
    assert str(torch.ops.aten._foreach_add_.ScalarList._schema.arguments[1].type) == "List[number]"
    assert torch.ops.aten.add_.Tensor._name == "aten::add_.Tensor" and torch.ops.aten.exp.default._name == "aten::exp"
    assert "out" in torch.ops.aten.add.overloads()
    assert torch.Tag.inplace_view in torch.ops.aten.squeeze_.default.tags
    assert torch.Tag.dynamic_output_shape in torch.ops.aten.nonzero.default.tags
    assert hasattr(torch.Tag, "data_dependent_output")
    assert callable(torch.ops.aten.rms_norm.default.decompose)


def test_library_fallback_and_redispatch():
    assert "fallback" in dir(torch.library.Library)
    sig = inspect.signature(torch.library.Library.fallback)
    assert list(sig.parameters)[:3] == ["self", "fn", "dispatch_key"]
    ks = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    x = torch.arange(6.0)
    assert torch.ops.aten.view.default.redispatch(ks, x, [2, 3]).shape == (2, 3)
    assert "lib" in inspect.signature(torch.library.register_autograd).parameters


def test_record_function_switch():
    # the worker and the dispatcher hide tilescope's own aten calls from the profiler: with the
    # switch off, an aten op run under torch.profiler records no event; back on, it does again
    def recorded(enabled: bool) -> set[str]:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            torch._C._autograd._enable_record_function(enabled)
            try:
                torch.ones(3).add(1)
            finally:
                torch._C._autograd._enable_record_function(True)
        return {e.name for e in prof.events()}

    assert "aten::add" not in recorded(False)
    assert "aten::add" in recorded(True)


def test_attention_and_convolution_routing():
    # the native runtime's _fused_sdp_choice stub selects the "overrideable" fused attention
    q = torch.randn(1, 2, 8, 4, device="sim")
    choice = torch.ops.aten._fused_sdp_choice(q, q, q)
    assert choice == int(torch.nn.attention.SDPBackend.OVERRIDEABLE)
    fwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable.default._schema
    assert [r.name for r in fwd.returns][:2] == ["output", "logsumexp"] and len(fwd.returns) == 9
    bwd = torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward.default._schema
    assert [a.name for a in bwd.arguments][:6] == ["grad_out", "query", "key", "value", "attn_bias",
                                                   "grad_input_mask"]
    math = torch.ops.aten._scaled_dot_product_attention_math.default._schema
    assert [a.name for a in math.arguments][:6] == ["query", "key", "value", "attn_mask", "dropout_p", "is_causal"]
    # convolutions of this device reach convolution_overrideable; CPU computes them with convolution
    x, w = torch.randn(1, 2, 5, 5, device="sim"), torch.randn(3, 2, 3, 3, device="sim")
    with dev.recording() as recs:
        torch.nn.functional.conv2d(x, w)
    assert [r.op for r in recs] == ["aten::convolution_overrideable"]
    cb = torch.ops.aten.convolution_backward.default._schema
    assert [a.name for a in cb.arguments][3] == "bias_sizes"


def test_printing_upcasts_on_the_device():
    # torch._tensor_str formats non-CPU tensors through float64 on their device: the device
    # accepts float64 for that reason (modeled as float32)
    with dev.recording() as recs:
        text = repr(torch.tensor([1.5, 2.25], device="sim"))
    assert "2.2500" in text and any(r.op == "aten::_to_copy" or "copy" in r.op for r in recs)


def test_foreach_optimizers_use_this_device():
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

    assert "sim" in _get_foreach_kernels_supported_devices()


def test_fake_tensors_are_tensor_subclasses():
    # _composite_ops._traced: fake and functional tensors are recognised by their type
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    with FakeTensorMode():
        f = torch.empty(2)
    assert isinstance(f, FakeTensor) and type(f) is not torch.Tensor


def test_native_runtime_builds_and_exposes_its_functions():
    from tilescope.device._native_runtime import load

    rt = load()
    for name in ("initialize", "cpu_view", "empty", "memory_stats", "set_limit", "resize", "default_generator",
                 "current_device", "set_current_device", "storage_nbytes", "reset_peak"):
        assert callable(getattr(rt, name)), name
    t = rt.empty([2, 3], [3, 1], torch.float32, 0)
    assert t.device.type == "sim" and rt.cpu_view(t).data_ptr() == t.data_ptr()


@pytest.mark.parametrize("version", [torch.__version__])
def test_pinned_torch_version(version):
    assert version.startswith("2.13"), (
        f"tilescope's device is written against torch 2.13 (found {version}); run this canary suite and "
        f"the OpInfo sweep (benchmarks/opinfo_sweep.py) before relying on another version")
