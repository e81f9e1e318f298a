// Shape function and registration of the GIoU operator: torch.ops.giou_ops.giou.
#include <tilescope/gpsimd.h>

using namespace tilescope;

Tensor giou(const Tensor& boxes1, const Tensor& boxes2, double eps);  // giou.cpp

Tensor giou_shape(const Tensor& boxes1, const Tensor& boxes2, double eps) {
    TILESCOPE_CHECK(boxes1.dim() >= 1 && boxes1.size(-1) == 4, "boxes1 must have shape [..., 4]");
    TILESCOPE_CHECK(boxes1.sizes() == boxes2.sizes(), "boxes1 and boxes2 must have the same shape");
    TILESCOPE_CHECK(boxes1.scalar_type() == kFloat && boxes2.scalar_type() == kFloat, "boxes must be float32");
    TILESCOPE_CHECK(eps >= 0.0, "eps must be >= 0");
    IntArrayRef s = boxes1.sizes();
    return empty(IntArrayRef(s.data(), static_cast<int>(s.size()) - 1), kFloat);
}

TILESCOPE_LIBRARY(giou_ops, m) { m.def("giou", &giou_shape, &giou); }
