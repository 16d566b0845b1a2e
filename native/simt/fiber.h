// Fibers for the SIMT emulator: a stack per GPU thread and a context switch that saves only the
// callee-saved registers (x86-64 and aarch64 assembly in fiber.cc). Elsewhere, or with
// GOKV_SIMT_UCONTEXT defined, it falls back to ucontext, whose swapcontext makes a signal-mask system
// call per switch: correct, but slow for kernels with thousands of barriers.
#pragma once

#include <cstddef>

#if !defined(GOKV_SIMT_UCONTEXT) && !(defined(__x86_64__) || defined(__aarch64__))
#define GOKV_SIMT_UCONTEXT 1
#endif
#if defined(GOKV_SIMT_UCONTEXT)
#include <ucontext.h>
#endif

namespace simt {
namespace detail {

struct FiberContext {
#if defined(GOKV_SIMT_UCONTEXT)
  ucontext_t uc;
#else
  void *sp = nullptr;
#endif
};

// Prepares `fiber` to run entry(arg) on [stack_lo, stack_lo + size) at its first switch_fiber. entry must
// never return: it ends by switching away for good.
void make_fiber(FiberContext *fiber, void *stack_lo, size_t size, void (*entry)(void *), void *arg);

// Saves the running context in `from` and resumes `to`.
void switch_fiber(FiberContext *from, FiberContext *to);

// Stacks for one group's fibers, each with a PROT_NONE guard page below it, mapped once and reused by
// every later launch on this OS thread that needs no more stacks of no larger size.
class StackPool {
 public:
  StackPool() = default;
  StackPool(const StackPool &) = delete;
  StackPool &operator=(const StackPool &) = delete;
  ~StackPool();
  // Ensures `count` stacks of at least `size` bytes; false if the memory cannot be mapped.
  bool reserve(size_t count, size_t size);
  void *stack(size_t i) const { return base_ + i * stride_ + guard_; }
  size_t stack_size() const { return stride_ - guard_; }

 private:
  char *base_ = nullptr;
  size_t mapped_ = 0;
  size_t count_ = 0;
  size_t stride_ = 0;
  size_t guard_ = 0;
};

}  // namespace detail
}  // namespace simt
