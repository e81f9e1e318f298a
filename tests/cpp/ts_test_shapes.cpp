// Shape functions and registration of the test operators: torch.ops.ts_test.<op>.
#include <tilescope/gpsimd.h>

using namespace tilescope;

Tensor scale_rows(const Tensor& x, double alpha);
Tensor scale_rows_bad_offset(const Tensor& x, double alpha);
Tensor scale_rows_no_tail(const Tensor& x, double alpha);
Tensor tcm_hog(const Tensor& x, int64_t first, int64_t second);
Tensor read_past_end(const Tensor& x, int64_t extra);
Tensor overflow_tcm(const Tensor& x);
Tensor overrun_buffer(const Tensor& x);
Tensor write_input(const Tensor& x);
Tensor wrong_type(const Tensor& x);
Tensor copy_leaky(const Tensor& x);
Tensor axpb(const Tensor& x, double a, int64_t k, bool flag);
Tensor to_half_bits(const Tensor& x, bool bf16);
Tensor from_half_bits(const Tensor& x, bool bf16);
Tensor chunked_copy(const Tensor& x);

Tensor same_shape(const Tensor& x) {
    TILESCOPE_CHECK(x.scalar_type() == kFloat, "x must be float32");
    return empty(x.sizes(), kFloat);
}
Tensor same_shape_alpha(const Tensor& x, double) { return same_shape(x); }
Tensor same_shape_ii(const Tensor& x, int64_t, int64_t) { return same_shape(x); }
Tensor same_shape_i(const Tensor& x, int64_t) { return same_shape(x); }
Tensor axpb_shape(const Tensor& x, double, int64_t, bool) { return same_shape(x); }
Tensor half_bits_shape(const Tensor& x, bool) { return empty(x.sizes(), kShort); }
Tensor from_half_shape(const Tensor& x, bool) { return empty(x.sizes(), kFloat); }

TILESCOPE_LIBRARY(ts_test, m) {
    m.def("scale_rows", &same_shape_alpha, &scale_rows);
    m.def("scale_rows_bad_offset", &same_shape_alpha, &scale_rows_bad_offset);
    m.def("scale_rows_no_tail", &same_shape_alpha, &scale_rows_no_tail);
    m.def("tcm_hog", &same_shape_ii, &tcm_hog);
    m.def("read_past_end", &same_shape_i, &read_past_end);
    m.def("overflow_tcm", &same_shape, &overflow_tcm);
    m.def("overrun_buffer", &same_shape, &overrun_buffer);
    m.def("write_input", &same_shape, &write_input);
    m.def("wrong_type", &same_shape, &wrong_type);
    m.def("copy_leaky", &same_shape, &copy_leaky);
    m.def("axpb", &axpb_shape, &axpb);
    m.def("to_half_bits", &half_bits_shape, &to_half_bits);
    m.def("from_half_bits", &from_half_shape, &from_half_bits);
    m.def("chunked_copy", &same_shape, &chunked_copy);
}
