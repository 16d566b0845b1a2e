// baseline_attend.hpp: the attention of the dequantize-then-attend baseline (GOKV_ATTEND_DEQUANT_BASELINE,
// benchmarks only): attend_common.hpp over an f32 pool (the spec is the f32 layout of the same geometry) whose
// pages baseline_dequant.hpp materialized at the start of the scratch buffer; a port of
// native/metal/kernels/baseline_attend.metal. The same instances as attend.hpp
// (baseline_attend_<NQ>_<CPI>_<UPI>) and the same local memory.
#ifndef GOKV_SYCL_BASELINE_ATTEND_HPP
#define GOKV_SYCL_BASELINE_ATTEND_HPP

#include "attend_common.hpp"

namespace gokv_sycl {

template <uint32_t NQ, uint32_t CPI, uint32_t UPI> struct baseline_attend_kernel {
    args a;
    local_words tg;
    void operator()(sycl::nd_item<3> it) const { attend_main<NQ, CPI, UPI>(a, &tg[0], it, true); }
};

} // namespace gokv_sycl

#define GOKV_SYCL_INSTANCES_BASELINE_ATTEND(X)                             \
    X(baseline_attend_1_1_1, gokv_sycl::baseline_attend_kernel<1, 1, 1>)   \
    X(baseline_attend_1_1_2, gokv_sycl::baseline_attend_kernel<1, 1, 2>)   \
    X(baseline_attend_1_1_4, gokv_sycl::baseline_attend_kernel<1, 1, 4>)   \
    X(baseline_attend_1_1_8, gokv_sycl::baseline_attend_kernel<1, 1, 8>)   \
    X(baseline_attend_1_2_1, gokv_sycl::baseline_attend_kernel<1, 2, 1>)   \
    X(baseline_attend_1_2_2, gokv_sycl::baseline_attend_kernel<1, 2, 2>)   \
    X(baseline_attend_1_2_4, gokv_sycl::baseline_attend_kernel<1, 2, 4>)   \
    X(baseline_attend_1_2_8, gokv_sycl::baseline_attend_kernel<1, 2, 8>)   \
    X(baseline_attend_1_4_1, gokv_sycl::baseline_attend_kernel<1, 4, 1>)   \
    X(baseline_attend_1_4_2, gokv_sycl::baseline_attend_kernel<1, 4, 2>)   \
    X(baseline_attend_1_4_4, gokv_sycl::baseline_attend_kernel<1, 4, 4>)   \
    X(baseline_attend_1_8_1, gokv_sycl::baseline_attend_kernel<1, 8, 1>)   \
    X(baseline_attend_1_8_2, gokv_sycl::baseline_attend_kernel<1, 8, 2>)   \
    X(baseline_attend_1_16_1, gokv_sycl::baseline_attend_kernel<1, 16, 1>) \
    X(baseline_attend_2_1_1, gokv_sycl::baseline_attend_kernel<2, 1, 1>)   \
    X(baseline_attend_2_1_2, gokv_sycl::baseline_attend_kernel<2, 1, 2>)   \
    X(baseline_attend_2_1_4, gokv_sycl::baseline_attend_kernel<2, 1, 4>)   \
    X(baseline_attend_2_1_8, gokv_sycl::baseline_attend_kernel<2, 1, 8>)   \
    X(baseline_attend_2_2_1, gokv_sycl::baseline_attend_kernel<2, 2, 1>)   \
    X(baseline_attend_2_2_2, gokv_sycl::baseline_attend_kernel<2, 2, 2>)   \
    X(baseline_attend_2_2_4, gokv_sycl::baseline_attend_kernel<2, 2, 4>)   \
    X(baseline_attend_2_2_8, gokv_sycl::baseline_attend_kernel<2, 2, 8>)   \
    X(baseline_attend_2_4_1, gokv_sycl::baseline_attend_kernel<2, 4, 1>)   \
    X(baseline_attend_2_4_2, gokv_sycl::baseline_attend_kernel<2, 4, 2>)   \
    X(baseline_attend_2_4_4, gokv_sycl::baseline_attend_kernel<2, 4, 4>)   \
    X(baseline_attend_2_8_1, gokv_sycl::baseline_attend_kernel<2, 8, 1>)   \
    X(baseline_attend_2_8_2, gokv_sycl::baseline_attend_kernel<2, 8, 2>)   \
    X(baseline_attend_2_16_1, gokv_sycl::baseline_attend_kernel<2, 16, 1>) \
    X(baseline_attend_4_1_1, gokv_sycl::baseline_attend_kernel<4, 1, 1>)   \
    X(baseline_attend_4_1_2, gokv_sycl::baseline_attend_kernel<4, 1, 2>)   \
    X(baseline_attend_4_1_4, gokv_sycl::baseline_attend_kernel<4, 1, 4>)   \
    X(baseline_attend_4_1_8, gokv_sycl::baseline_attend_kernel<4, 1, 8>)   \
    X(baseline_attend_4_2_1, gokv_sycl::baseline_attend_kernel<4, 2, 1>)   \
    X(baseline_attend_4_2_2, gokv_sycl::baseline_attend_kernel<4, 2, 2>)   \
    X(baseline_attend_4_2_4, gokv_sycl::baseline_attend_kernel<4, 2, 4>)   \
    X(baseline_attend_4_2_8, gokv_sycl::baseline_attend_kernel<4, 2, 8>)   \
    X(baseline_attend_4_4_1, gokv_sycl::baseline_attend_kernel<4, 4, 1>)   \
    X(baseline_attend_4_4_2, gokv_sycl::baseline_attend_kernel<4, 4, 2>)   \
    X(baseline_attend_4_4_4, gokv_sycl::baseline_attend_kernel<4, 4, 4>)   \
    X(baseline_attend_4_8_1, gokv_sycl::baseline_attend_kernel<4, 8, 1>)   \
    X(baseline_attend_4_8_2, gokv_sycl::baseline_attend_kernel<4, 8, 2>)   \
    X(baseline_attend_4_16_1, gokv_sycl::baseline_attend_kernel<4, 16, 1>) \
    X(baseline_attend_8_1_1, gokv_sycl::baseline_attend_kernel<8, 1, 1>)   \
    X(baseline_attend_8_1_2, gokv_sycl::baseline_attend_kernel<8, 1, 2>)   \
    X(baseline_attend_8_1_4, gokv_sycl::baseline_attend_kernel<8, 1, 4>)   \
    X(baseline_attend_8_1_8, gokv_sycl::baseline_attend_kernel<8, 1, 8>)   \
    X(baseline_attend_8_2_1, gokv_sycl::baseline_attend_kernel<8, 2, 1>)   \
    X(baseline_attend_8_2_2, gokv_sycl::baseline_attend_kernel<8, 2, 2>)   \
    X(baseline_attend_8_2_4, gokv_sycl::baseline_attend_kernel<8, 2, 4>)   \
    X(baseline_attend_8_2_8, gokv_sycl::baseline_attend_kernel<8, 2, 8>)   \
    X(baseline_attend_8_4_1, gokv_sycl::baseline_attend_kernel<8, 4, 1>)   \
    X(baseline_attend_8_4_2, gokv_sycl::baseline_attend_kernel<8, 4, 2>)   \
    X(baseline_attend_8_4_4, gokv_sycl::baseline_attend_kernel<8, 4, 4>)   \
    X(baseline_attend_8_8_1, gokv_sycl::baseline_attend_kernel<8, 8, 1>)   \
    X(baseline_attend_8_8_2, gokv_sycl::baseline_attend_kernel<8, 8, 2>)   \
    X(baseline_attend_16_1_1, gokv_sycl::baseline_attend_kernel<16, 1, 1>) \
    X(baseline_attend_16_1_2, gokv_sycl::baseline_attend_kernel<16, 1, 2>) \
    X(baseline_attend_16_1_4, gokv_sycl::baseline_attend_kernel<16, 1, 4>) \
    X(baseline_attend_16_1_8, gokv_sycl::baseline_attend_kernel<16, 1, 8>) \
    X(baseline_attend_16_2_1, gokv_sycl::baseline_attend_kernel<16, 2, 1>) \
    X(baseline_attend_16_2_2, gokv_sycl::baseline_attend_kernel<16, 2, 2>) \
    X(baseline_attend_16_2_4, gokv_sycl::baseline_attend_kernel<16, 2, 4>) \
    X(baseline_attend_16_4_1, gokv_sycl::baseline_attend_kernel<16, 4, 1>) \
    X(baseline_attend_16_4_2, gokv_sycl::baseline_attend_kernel<16, 4, 2>) \
    X(baseline_attend_32_1_1, gokv_sycl::baseline_attend_kernel<32, 1, 1>) \
    X(baseline_attend_32_1_2, gokv_sycl::baseline_attend_kernel<32, 1, 2>) \
    X(baseline_attend_32_1_4, gokv_sycl::baseline_attend_kernel<32, 1, 4>) \
    X(baseline_attend_32_2_1, gokv_sycl::baseline_attend_kernel<32, 2, 1>) \
    X(baseline_attend_32_2_2, gokv_sycl::baseline_attend_kernel<32, 2, 2>) \
    X(baseline_attend_64_1_1, gokv_sycl::baseline_attend_kernel<64, 1, 1>) \
    X(baseline_attend_64_1_2, gokv_sycl::baseline_attend_kernel<64, 1, 2>)
GOKV_SYCL_INSTANCES_BASELINE_ATTEND(GOKV_SYCL_DECLARE_INSTANCE)

#endif
