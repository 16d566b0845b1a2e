/*
 * threadpool.h: a fixed pool of worker threads for the CPU module's parallel loops. The calling thread
 * works too, so a pool of n threads spawns n - 1. One loop runs at a time per pool: concurrent callers
 * queue on a mutex (attention calls on one device are serialized, documented in gokv.h).
 */
#ifndef GOKV_CPU_THREADPOOL_H
#define GOKV_CPU_THREADPOOL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpu_threadpool cpu_threadpool;

/* fn(ctx, index, worker) for index in [0, n); worker in [0, n_threads) identifies per-thread scratch. */
typedef void (*cpu_task_fn)(void *ctx, int64_t index, int32_t worker);

/* NULL when threads cannot be created or memory is short. */
cpu_threadpool *cpu_threadpool_create(int32_t n_threads);
void cpu_threadpool_destroy(cpu_threadpool *tp);
int32_t cpu_threadpool_size(const cpu_threadpool *tp);
/* Runs fn over [0, n) on all threads and returns when every index is done. */
void cpu_threadpool_run(cpu_threadpool *tp, int64_t n, cpu_task_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
