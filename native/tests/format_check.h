/*
 * format_check.h: checks of the stored format against docs/architecture.md §4 / gokv_layout.h, shared by the
 * format tests: per-group scale/bias/codes from the raw page bytes, and the read-back values.
 */
#ifndef GOKV_TESTS_FORMAT_CHECK_H
#define GOKV_TESTS_FORMAT_CHECK_H

#include <string>
#include <vector>

#include "reference.h"

namespace gokvtest {

/* Accumulates failures, reporting only the first few so one broken rule does not flood the log. */
struct FailBudget {
    int reported = 0, total = 0;
    void fail(const std::string &msg);
};

/* One quantization group: x (original inputs as the quantizer sees them: fp16-rounded for KIVI), the
 * stored codes, the stored fp16 scale and bias bits, and the read-back dequantized values. Checks
 * b == fp16(min), s == fp16((max-min)/(2^bits-1)) (1 fp16 ulp of slack for how the quotient is formed),
 * s == 0 for constant groups, q == clamp(round((x-b)/s)) except at near-ties, read == q*s+b, and
 * |read - x| within s/2 plus the fp16 rounding of s and b. */
void check_group(FailBudget &fb, const std::string &what, const std::vector<float> &x, const std::vector<uint32_t> &q,
                 uint16_t s_bits, uint16_t b_bits, const std::vector<float> &dq, int32_t bits);

/* Checks the whole stored content of a sequence of a pool against its inputs (s.k, s.v) and the
 * read-back (kdq, vdq): pages (every format) and, for KIVI, the residual ring. */
void check_stored_sequence(FailBudget &fb, gokv_pool *pool, const PoolCfg &c, const Seq &s,
                           const std::vector<float> &kdq, const std::vector<float> &vdq);

} // namespace gokvtest
#endif
