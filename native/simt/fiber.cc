// The context switch and the stack pool (fiber.h).
#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#if defined(__SANITIZE_ADDRESS__)
#define GOKV_SIMT_FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GOKV_SIMT_FIBER_ASAN 1
#endif
#endif
#if defined(GOKV_SIMT_FIBER_ASAN)
#include <sanitizer/asan_interface.h>
#endif

#if !defined(GOKV_SIMT_UCONTEXT)

#if defined(__APPLE__)
#define GOKV_SIMT_SYM(name) "_" #name
#define GOKV_SIMT_TYPE(name)
#else
#define GOKV_SIMT_SYM(name) #name
#define GOKV_SIMT_TYPE(name) ".type " #name ",%function\n"
#endif

extern "C" void gokv_simt_switch(void **save_sp, void *new_sp);
extern "C" void gokv_simt_trampoline();

#if defined(__x86_64__)
// System V x86-64: rbx, rbp, r12-r15 are callee-saved, and so are MXCSR's control bits and the x87
// control word. A suspended fiber's stack holds, from its saved sp up: x87 control word (8 bytes slot),
// MXCSR (8 bytes slot), r15, r14, r13, r12, rbx, rbp, return address.
__asm__(
    ".text\n"
    ".globl " GOKV_SIMT_SYM(gokv_simt_switch) "\n"
    GOKV_SIMT_TYPE(gokv_simt_switch)
    ".p2align 4\n"
    GOKV_SIMT_SYM(gokv_simt_switch) ":\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  subq $16, %rsp\n"
    "  stmxcsr 8(%rsp)\n"
    "  fnstcw (%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr 8(%rsp)\n"
    "  fldcw (%rsp)\n"
    "  addq $16, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".globl " GOKV_SIMT_SYM(gokv_simt_trampoline) "\n"
    GOKV_SIMT_TYPE(gokv_simt_trampoline)
    ".p2align 4\n"
    GOKV_SIMT_SYM(gokv_simt_trampoline) ":\n"
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n");

namespace simt {
namespace detail {
void make_fiber(FiberContext *fiber, void *stack_lo, size_t size, void (*entry)(void *), void *arg) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack_lo) + size) & ~uintptr_t{15};
  uint64_t *frame = reinterpret_cast<uint64_t *>(top - 72);
  std::memset(frame, 0, 72);
  frame[0] = 0x037F;  // x87 control word: default precision and masks
  frame[1] = 0x1F80;  // MXCSR: all exceptions masked, round to nearest, no FTZ/DAZ
  frame[2] = 0;                                    // r15
  frame[3] = 0;                                    // r14
  frame[4] = reinterpret_cast<uint64_t>(entry);    // r13
  frame[5] = reinterpret_cast<uint64_t>(arg);      // r12
  frame[6] = 0;                                    // rbx
  frame[7] = 0;                                    // rbp: ends frame-pointer walks
  frame[8] = reinterpret_cast<uint64_t>(&gokv_simt_trampoline);  // at top - 8: rsp is 16-aligned after ret
  fiber->sp = frame;
}
}  // namespace detail
}  // namespace simt

#elif defined(__aarch64__)
// AAPCS64: x19-x28, x29 (fp), x30 (lr) and the low halves of v8-v15 are callee-saved. A suspended fiber's
// stack holds 160 bytes from its saved sp: x19..x30, then d8..d15.
__asm__(
    ".text\n"
    ".globl " GOKV_SIMT_SYM(gokv_simt_switch) "\n"
    GOKV_SIMT_TYPE(gokv_simt_switch)
    ".p2align 4\n"
    GOKV_SIMT_SYM(gokv_simt_switch) ":\n"
    "  sub sp, sp, #160\n"
    "  stp x19, x20, [sp, #0]\n"
    "  stp x21, x22, [sp, #16]\n"
    "  stp x23, x24, [sp, #32]\n"
    "  stp x25, x26, [sp, #48]\n"
    "  stp x27, x28, [sp, #64]\n"
    "  stp x29, x30, [sp, #80]\n"
    "  stp d8, d9, [sp, #96]\n"
    "  stp d10, d11, [sp, #112]\n"
    "  stp d12, d13, [sp, #128]\n"
    "  stp d14, d15, [sp, #144]\n"
    "  mov x9, sp\n"
    "  str x9, [x0]\n"
    "  mov sp, x1\n"
    "  ldp x19, x20, [sp, #0]\n"
    "  ldp x21, x22, [sp, #16]\n"
    "  ldp x23, x24, [sp, #32]\n"
    "  ldp x25, x26, [sp, #48]\n"
    "  ldp x27, x28, [sp, #64]\n"
    "  ldp x29, x30, [sp, #80]\n"
    "  ldp d8, d9, [sp, #96]\n"
    "  ldp d10, d11, [sp, #112]\n"
    "  ldp d12, d13, [sp, #128]\n"
    "  ldp d14, d15, [sp, #144]\n"
    "  add sp, sp, #160\n"
    "  ret\n"
    ".globl " GOKV_SIMT_SYM(gokv_simt_trampoline) "\n"
    GOKV_SIMT_TYPE(gokv_simt_trampoline)
    ".p2align 4\n"
    GOKV_SIMT_SYM(gokv_simt_trampoline) ":\n"
    "  mov x0, x19\n"
    "  blr x20\n"
    "  brk #0\n");

namespace simt {
namespace detail {
void make_fiber(FiberContext *fiber, void *stack_lo, size_t size, void (*entry)(void *), void *arg) {
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack_lo) + size) & ~uintptr_t{15};
  uint64_t *frame = reinterpret_cast<uint64_t *>(top - 160);
  std::memset(frame, 0, 160);
  frame[0] = reinterpret_cast<uint64_t>(arg);                     // x19
  frame[1] = reinterpret_cast<uint64_t>(entry);                   // x20
  frame[10] = 0;                                                  // x29: ends frame-pointer walks
  frame[11] = reinterpret_cast<uint64_t>(&gokv_simt_trampoline);  // x30
  fiber->sp = frame;
}
}  // namespace detail
}  // namespace simt
#endif

namespace simt {
namespace detail {
void switch_fiber(FiberContext *from, FiberContext *to) { gokv_simt_switch(&from->sp, to->sp); }
}  // namespace detail
}  // namespace simt

#else  // GOKV_SIMT_UCONTEXT

namespace simt {
namespace detail {
namespace {
// makecontext passes int arguments only: the pointers travel in two 32-bit halves.
void ucontext_entry(unsigned entry_hi, unsigned entry_lo, unsigned arg_hi, unsigned arg_lo) {
  auto entry = reinterpret_cast<void (*)(void *)>((uint64_t{entry_hi} << 32) | entry_lo);
  auto arg = reinterpret_cast<void *>((uint64_t{arg_hi} << 32) | arg_lo);
  entry(arg);
}
}  // namespace

void make_fiber(FiberContext *fiber, void *stack_lo, size_t size, void (*entry)(void *), void *arg) {
  getcontext(&fiber->uc);
  fiber->uc.uc_stack.ss_sp = stack_lo;
  fiber->uc.uc_stack.ss_size = size;
  fiber->uc.uc_link = nullptr;
  uint64_t e = reinterpret_cast<uint64_t>(reinterpret_cast<uintptr_t>(entry));
  uint64_t a = reinterpret_cast<uint64_t>(reinterpret_cast<uintptr_t>(arg));
  makecontext(&fiber->uc, reinterpret_cast<void (*)()>(ucontext_entry), 4, unsigned(e >> 32), unsigned(e),
              unsigned(a >> 32), unsigned(a));
}

void switch_fiber(FiberContext *from, FiberContext *to) { swapcontext(&from->uc, &to->uc); }
}  // namespace detail
}  // namespace simt

#endif

namespace simt {
namespace detail {

// Unmaps the stacks. Under ASan their frames' redzones are unpoisoned first: the shadow outlives the
// mapping, and the next mmap at these addresses (a kernel's buffer, say) would read as a stack underflow.
static void unmap_stacks(char *base, size_t bytes) {
#if defined(GOKV_SIMT_FIBER_ASAN)
  __asan_unpoison_memory_region(base, bytes);
#endif
  munmap(base, bytes);
}

StackPool::~StackPool() {
  if (base_ != nullptr) unmap_stacks(base_, mapped_);
}

bool StackPool::reserve(size_t count, size_t size) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t stack = (size + page - 1) / page * page;
  if (base_ != nullptr && count <= count_ && stack + guard_ <= stride_) return true;
  if (base_ != nullptr) unmap_stacks(base_, mapped_);
  base_ = nullptr;
  count_ = 0;
  if (stack < stride_ - guard_) stack = stride_ - guard_;  // never shrink: keep the largest size asked for
  size_t stride = stack + page;
  size_t bytes = count * stride;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS;
#if defined(MAP_NORESERVE)
  flags |= MAP_NORESERVE;
#endif
#if defined(MAP_STACK)
  flags |= MAP_STACK;
#endif
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) return false;
  base_ = static_cast<char *>(p);
  mapped_ = bytes;
  count_ = count;
  stride_ = stride;
  guard_ = page;
  for (size_t i = 0; i < count; i++) {
    if (mprotect(base_ + i * stride, page, PROT_NONE) != 0) {
      munmap(base_, mapped_);
      base_ = nullptr;
      count_ = 0;
      return false;
    }
  }
  return true;
}

}  // namespace detail
}  // namespace simt
