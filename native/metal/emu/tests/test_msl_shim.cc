// test_msl_shim.cc: the MSL shim (native/metal/emu/msl/metal_stdlib) on its own: vector values and
// conversions, swizzles, as_type, half rounding, the math's exactness, atomics, and the simdgroup functions
// and barriers run under simt::launch, including the errors a wrong kernel must produce.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <metal_stdlib>
using namespace metal;

namespace {

TEST(MslShim, VectorConversionsAreByValue) {
    uint4 u(1u, 2u, 300u, 0xffffffffu);
    float4 f = float4(u);
    EXPECT_EQ(f.x, 1.0f);
    EXPECT_EQ(f.y, 2.0f);
    EXPECT_EQ(f.z, 300.0f);
    EXPECT_EQ(f.w, 4294967296.0f);
    int4 back = int4(float4(-1.5f, 2.75f, 7.0f, -0.25f));  // truncation toward zero, as a C cast
    EXPECT_EQ(back.x, -1);
    EXPECT_EQ(back.y, 2);
    EXPECT_EQ(back.z, 7);
    EXPECT_EQ(back.w, 0);
    half2 h = half2(float2(0.1f, 65504.0f));
    EXPECT_EQ(as_type<ushort>(h.x), 0x2e66);  // 0.1 rounds to nearest even in fp16
    EXPECT_EQ(as_type<ushort>(h.y), 0x7bff);
    ushort4 s = ushort4(uchar4(uchar(1), uchar(2), uchar(3), uchar(255)));
    EXPECT_EQ(s.w, 255);
}

TEST(MslShim, ConstructorsAndSwizzles) {
    float2 a(1.0f, 2.0f);
    float4 b(a, 3.0f, 4.0f);
    float4 c(a, float2(5.0f, 6.0f));
    float3 d(b.xy, 9.0f);
    float4 e(d, 10.0f);
    float4 splat = 7.0f;
    EXPECT_EQ(b.w, 4.0f);
    EXPECT_EQ(c.z, 5.0f);
    EXPECT_EQ(d.z, 9.0f);
    EXPECT_EQ(e.w, 10.0f);
    EXPECT_EQ(splat.y, 7.0f);
    float2 zw = c.zw;
    EXPECT_EQ(zw.x, 5.0f);
    EXPECT_EQ(zw.y, 6.0f);
    float3 xyz = e.xyz;
    EXPECT_EQ(xyz.y, 2.0f);
    float2 sum = b.xy + b.zw;  // operators through a swizzle
    EXPECT_EQ(sum.x, 4.0f);
    EXPECT_EQ(sum.y, 6.0f);
    b.xy = float2(-1.0f, -2.0f);
    EXPECT_EQ(b.x, -1.0f);
    EXPECT_EQ(b[1], -2.0f);
    b[3] = 0.5f;
    EXPECT_EQ(b.w, 0.5f);
    float2 yx = a.yx;
    EXPECT_EQ(yx.x, 2.0f);
}

TEST(MslShim, ElementwiseOperatorsAndComparisons) {
    uint4 u(0xf0u, 3u, 8u, 1u);
    uint4 r = (u & 0x30u) | ((u << 1u) ^ uint4(1u));
    EXPECT_EQ(r.x, (0xf0u & 0x30u) | ((0xf0u << 1u) ^ 1u));
    EXPECT_EQ((u >> uint4(4u, 0u, 3u, 0u)).z, 1u);
    ushort4 s = ushort4(ushort(65535)) + ushort4(ushort(1));  // stays 16-bit, as in MSL
    EXPECT_EQ(s.x, 0);
    float4 f(1.0f, 2.0f, 3.0f, 4.0f);
    bool4 lt = f < 2.5f;
    EXPECT_TRUE(lt.x && lt.y && !lt.z && !lt.w);
    EXPECT_TRUE(any(lt));
    EXPECT_FALSE(all(lt));
    float4 sel = select(f, float4(0.0f), lt);
    EXPECT_EQ(sel.x, 0.0f);
    EXPECT_EQ(sel.z, 3.0f);
    EXPECT_EQ(dot(f, f), 30.0f);
    f *= 2.0f;
    EXPECT_EQ(f.w, 8.0f);
    EXPECT_EQ((-f).y, -4.0f);
    EXPECT_EQ(max(f, float4(5.0f)).x, 5.0f);
    EXPECT_EQ(clamp(7u, 0u, 3u), 3u);
    EXPECT_EQ(clamp(float4(-1.0f, 0.5f, 2.0f, 0.0f), 0.0f, 1.0f).z, 1.0f);
}

TEST(MslShim, AsType) {
    EXPECT_EQ(as_type<uint>(1.0f), 0x3f800000u);
    EXPECT_EQ(as_type<float>(0xbf800000u), -1.0f);
    half2 h = as_type<half2>(0x3c00bc00u);  // element 0 in the low half
    EXPECT_EQ(float(h.x), -1.0f);
    EXPECT_EQ(float(h.y), 1.0f);
    uint2 w = as_type<uint2>(float2(1.0f, 2.0f));
    EXPECT_EQ(w.y, 0x40000000u);
}

TEST(MslShim, HalfRoundsToNearestEven) {
    // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even (1.0)
    EXPECT_EQ(as_type<ushort>(half(1.0f + 0x1p-11f)), 0x3c00);
    // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 and 1 + 2^-9: to the even (1 + 2^-9)
    EXPECT_EQ(as_type<ushort>(half(1.0f + 3.0f * 0x1p-11f)), 0x3c02);
    EXPECT_EQ(as_type<ushort>(half(65520.0f)), 0x7c00);  // overflows to inf
    EXPECT_EQ(as_type<ushort>(half(0x1p-25f)), 0x0000);  // half the smallest subnormal: ties to zero
    EXPECT_EQ(as_type<ushort>(half(0x1.8p-25f)), 0x0001);
    half a = half(0.1f), b = half(0.2f);
    half c = a + b;  // one rounding of the exact sum, as a half ALU
    EXPECT_EQ(as_type<ushort>(c), as_type<ushort>(half(float(a) + float(b))));
}

TEST(MslShim, MathIsNotFast) {
    volatile float big = 1e30f;
    float x = big * big;  // inf survives (no finite-math assumption)
    EXPECT_TRUE(isinf(x));
    EXPECT_TRUE(isnan(x - x));
    EXPECT_FALSE(isfinite(x));
    EXPECT_EQ(fma(0.1f, 10.0f, -1.0f), std::fma(0.1f, 10.0f, -1.0f));
    EXPECT_EQ(exp(1.0f), std::exp(1.0f));
    EXPECT_EQ(precise::exp(-3.0f), std::exp(-3.0f));
    EXPECT_EQ(rint(2.5f), 2.0f);
    EXPECT_EQ(round(2.5f), 3.0f);
    EXPECT_EQ(floor(-0.5f), -1.0f);
    EXPECT_EQ(popcount(0xf0f0u), 8u);
    EXPECT_EQ(clz(1u), 31u);
    EXPECT_EQ(ctz(0u), 32u);
    EXPECT_EQ(sign(-3.0f), -1.0f);
    EXPECT_EQ(min(1.0f, NAN), 1.0f);  // fmin: a NaN argument gives the other
    EXPECT_EQ(abs(-3), 3);
    EXPECT_EQ(abs(-2.5f), 2.5f);
    EXPECT_EQ(float(abs(half(-2.0f))), 2.0f);
    EXPECT_EQ(extract_bits(0xabcdu, 4u, 8u), 0xbcu);
    // unsuffixed literals: the kernels' build passes -fsingle-precision-constant, so 0.1 is 0.1f there
}

TEST(MslShim, Atomics) {
    uint words[2] = {0u, 5u};
    device atomic_uint *a = (device atomic_uint *)&words[0];
    EXPECT_EQ(atomic_fetch_or_explicit(a, 0x10u, memory_order_relaxed), 0u);
    EXPECT_EQ(atomic_fetch_add_explicit(a, 2u, memory_order_relaxed), 0x10u);
    EXPECT_EQ(atomic_fetch_and_explicit(a, ~0x10u, memory_order_relaxed), 0x12u);
    EXPECT_EQ(atomic_load_explicit(a, memory_order_relaxed), 2u);
    threadgroup atomic_uint *b = (threadgroup atomic_uint *)&words[1];
    EXPECT_EQ(atomic_fetch_max_explicit(b, 9u, memory_order_relaxed), 5u);
    EXPECT_EQ(atomic_fetch_min_explicit(b, 3u, memory_order_relaxed), 9u);
    uint expected = 3u;
    EXPECT_TRUE(atomic_compare_exchange_weak_explicit(b, &expected, 4u, memory_order_relaxed, memory_order_relaxed));
    expected = 7u;
    EXPECT_FALSE(atomic_compare_exchange_weak_explicit(b, &expected, 1u, memory_order_relaxed, memory_order_relaxed));
    EXPECT_EQ(expected, 4u);
    EXPECT_EQ(atomic_exchange_explicit(b, 11u, memory_order_relaxed), 4u);
    atomic_store_explicit(b, 12u, memory_order_relaxed);
    EXPECT_EQ(words[1], 12u);
}

simt::Dispatch one_group(uint32_t threads, size_t tg_bytes, simt::RunOrder order) {
    simt::Dispatch d;
    d.grid = {1, 1, 1};
    d.threads = {threads, 1, 1};
    d.simd_width = 32;
    d.threadgroup_memory_bytes = tg_bytes;
    d.order = order;
    d.seed = 7;
    d.stack_bytes = 64 * 1024;
    return d;
}

const simt::RunOrder kOrders[] = {simt::RunOrder::forward, simt::RunOrder::reverse, simt::RunOrder::shuffled};

TEST(MslShim, SimdgroupFunctions) {
    for (simt::RunOrder order : kOrders) {
        std::vector<uint32_t> out(64 * 16);
        simt::Status st = simt::launch(one_group(64, 0, order), [&] {
            const uint lane = simt::thread_info().thread_index_in_simdgroup;
            const uint tid = simt::thread_info().thread_index_in_threadgroup;
            uint32_t *o = &out[tid * 16];
            o[0] = simd_sum(lane);
            o[1] = simd_prefix_exclusive_sum(1u);
            o[2] = simd_prefix_inclusive_sum(1u);
            o[3] = simd_max(lane);
            o[4] = simd_min(lane + 3u);
            o[5] = simd_shuffle(lane * 2u, ushort(5));
            o[6] = simd_shuffle_xor(lane, ushort(1));
            o[7] = simd_shuffle_down(lane, ushort(1));
            o[8] = simd_shuffle_up(lane, ushort(1));
            o[9] = simd_broadcast(lane + 100u, ushort(3));
            o[10] = uint((uint64_t)simd_ballot(lane < 4u));
            o[11] = simd_any(lane == 31u) ? 1u : 0u;
            o[12] = simd_all(lane < 31u) ? 1u : 0u;
            o[13] = simd_is_first() ? 1u : 0u;
            float4 v = simd_max(float4(float(lane), -float(lane), 1.0f, 0.0f));
            o[14] = uint(v.x) * 1000u + uint(-v.y);
            float s = simd_sum(float2(1.0f, 2.0f)).y;
            o[15] = uint(s);
            simdgroup_barrier(mem_flags::mem_none);
        });
        ASSERT_TRUE(st.ok) << st.message;
        for (uint32_t t = 0; t < 64; t++) {
            const uint32_t lane = t % 32, *o = &out[t * 16];
            EXPECT_EQ(o[0], 496u);
            EXPECT_EQ(o[1], lane);
            EXPECT_EQ(o[2], lane + 1);
            EXPECT_EQ(o[3], 31u);
            EXPECT_EQ(o[4], 3u);
            EXPECT_EQ(o[5], 10u);
            EXPECT_EQ(o[6], lane ^ 1u);
            EXPECT_EQ(o[7], lane < 31 ? lane + 1 : lane);
            EXPECT_EQ(o[8], lane > 0 ? lane - 1 : lane);
            EXPECT_EQ(o[9], 103u);
            EXPECT_EQ(o[10], 0xfu);
            EXPECT_EQ(o[11], 1u);
            EXPECT_EQ(o[12], 0u);
            EXPECT_EQ(o[13], lane == 0 ? 1u : 0u);
            EXPECT_EQ(o[14], 31000u);
            EXPECT_EQ(o[15], 64u);
        }
    }
}

// A reduction through threadgroup memory: correct only with both barriers.
TEST(MslShim, ThreadgroupMemoryAndBarriers) {
    for (simt::RunOrder order : kOrders) {
        uint32_t result = 0;
        simt::Status st = simt::launch(one_group(128, 4 * 4, order), [&] {
            const simt::ThreadInfo &t = simt::thread_info();
            threadgroup float *part = (threadgroup float *)t.threadgroup_memory;
            float s = simd_sum(float(t.thread_index_in_threadgroup));
            if (t.thread_index_in_simdgroup == 0) part[t.simdgroup_index_in_threadgroup] = s;
            threadgroup_barrier(mem_flags::mem_threadgroup);
            if (t.thread_index_in_threadgroup == 0) result = uint(part[0] + part[1] + part[2] + part[3]);
            threadgroup_barrier(mem_flags::mem_threadgroup | mem_flags::mem_device);
        });
        ASSERT_TRUE(st.ok) << st.message;
        EXPECT_EQ(result, 127u * 128u / 2u);
    }
}

TEST(MslShim, MissingBarrierShowsAsOrderDependence) {
    // Without a barrier between the writes and thread 0's read, the result depends on the run order: in
    // forward order thread 0 reads its neighbours' slots still poisoned (NaN), in reverse order written.
    auto run = [](simt::RunOrder order) {
        uint32_t nan_seen = 2;
        simt::Status st = simt::launch(one_group(64, 64 * 4, order), [&] {
            const simt::ThreadInfo &t = simt::thread_info();
            threadgroup float *x = (threadgroup float *)t.threadgroup_memory;
            (void)simd_sum(0.0f);  // a switch point, as every kernel has; no threadgroup barrier after it
            x[t.thread_index_in_threadgroup] = 1.0f;
            if (t.thread_index_in_threadgroup == 0) {
                float s = 0.0f;
                for (int i = 0; i < 64; i++) s += x[i];
                nan_seen = isnan(s) ? 1u : 0u;
            }
        });
        EXPECT_TRUE(st.ok) << st.message;
        return nan_seen;
    };
    EXPECT_EQ(run(simt::RunOrder::forward), 1u);
    EXPECT_EQ(run(simt::RunOrder::reverse), 0u);
}

TEST(MslShim, DivergentBarrierIsAnError) {
    simt::Status st = simt::launch(one_group(64, 0, simt::RunOrder::forward), [&] {
        if (simt::thread_info().thread_index_in_threadgroup < 32)
            threadgroup_barrier(mem_flags::mem_threadgroup);
        else
            threadgroup_barrier(mem_flags::mem_threadgroup);
    });
    ASSERT_FALSE(st.ok);
    EXPECT_NE(st.message.find("test_msl_shim.cc"), std::string::npos) << st.message;
}

TEST(MslShim, BarrierSkippedByOneThreadIsAnError) {
    simt::Status st = simt::launch(one_group(64, 0, simt::RunOrder::shuffled), [&] {
        if (simt::thread_info().thread_index_in_threadgroup == 5) return;
        threadgroup_barrier(mem_flags::mem_threadgroup);
    });
    ASSERT_FALSE(st.ok);
    EXPECT_NE(st.message.find("exited"), std::string::npos) << st.message;
    EXPECT_NE(st.message.find("test_msl_shim.cc"), std::string::npos) << st.message;
}

TEST(MslShim, DivergentSimdFunctionIsAnError) {
    simt::Status st = simt::launch(one_group(32, 0, simt::RunOrder::forward), [&] {
        const uint lane = simt::thread_info().thread_index_in_simdgroup;
        if (lane < 16)
            (void)simd_sum(1.0f);
        else
            (void)simd_max(1.0f);
    });
    ASSERT_FALSE(st.ok);
    EXPECT_NE(st.message.find("test_msl_shim.cc"), std::string::npos) << st.message;
}

TEST(MslShim, SimdFunctionInDivergentControlFlowIsAnError) {
    simt::Status st = simt::launch(one_group(32, 0, simt::RunOrder::forward), [&] {
        if (simt::thread_info().thread_index_in_simdgroup == 3) return;
        (void)simd_ballot(true);
    });
    ASSERT_FALSE(st.ok);
    EXPECT_NE(st.message.find("test_msl_shim.cc"), std::string::npos) << st.message;
}

TEST(MslShim, SimdgroupBarrierIsCheckedPerSimdgroup) {
    simt::Status st = simt::launch(one_group(64, 0, simt::RunOrder::forward), [&] {
        if (simt::thread_info().thread_index_in_simdgroup == 0) return;
        simdgroup_barrier(mem_flags::mem_threadgroup);
    });
    ASSERT_FALSE(st.ok);
    EXPECT_NE(st.message.find("simdgroup_barrier"), std::string::npos) << st.message;
}

}  // namespace
