// Must not compile (ctest sycl_emu.rejects_non_device_copyable_kernel): a kernel capturing a std::vector is
// not device copyable, and icpx rejects it too. With -DGOKV_ACCEPTED the capture is a pointer, and it must
// compile (sycl_emu.accepts_device_copyable_kernel), so the failure is the one meant.
#include <sycl/sycl.hpp>

#include <vector>

int main() {
    sycl::queue q;
    std::vector<float> weights(16, 1.0f);
#if defined(GOKV_ACCEPTED)
    const float *captured = weights.data();
#else
    const std::vector<float> &captured = weights;
#endif
    float *out = sycl::malloc_shared<float>(16, q);
    q.submit([&](sycl::handler &h) {
        h.parallel_for(sycl::nd_range<1>(16, 16), [=](sycl::nd_item<1> it) {
            out[it.get_global_id(0)] = captured[it.get_global_id(0)];
        });
    });
    q.wait_and_throw();
    sycl::free(out, q);
    return 0;
}
