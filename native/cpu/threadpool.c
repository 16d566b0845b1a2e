/*
 * threadpool.c: see threadpool.h. Indices are handed out by an atomic counter, so uneven work balances.
 * The caller waits for the indices to be done, not for every worker to pass through the loop: on a
 * machine with more runnable threads than cores (an engine's own threads, other processes), a worker that
 * is not scheduled in time simply takes no index, and the caller does its share instead of waiting a time
 * slice for it. A claim carries its loop's generation, so a worker that wakes late never takes an index
 * of a later loop for the one it saw.
 *
 * Waking a sleeping thread costs tens of microseconds (a futex, and on a VM an idle vCPU's wake-up): measured
 * on the 2-core machine, a 1K-token decode ran no faster on two threads than on one. So waiters spin for up to
 * a while first (workers for the next loop, the caller for the loop's last index) and only then sleep on the
 * condition variables: back-to-back calls (each attention call runs two loops, and a decode step runs one
 * call per layer) never sleep, and an idle pool burns at most that while per worker after its last loop.
 * The while is 200 µs, or GOKV_CPU_SPIN_US microseconds when set when the pool is created (0: never spin,
 * for engines that keep every core busy between attention calls).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "gokv_backend.h"
#include "threadpool.h"

enum { CPU_SPIN_NS_DEFAULT = 200000, CPU_SPIN_NS_MAX = 100000000 };

struct cpu_threadpool {
    int32_t n_threads;
    int64_t spin_ns; /* how long a waiter spins before it sleeps */
    pthread_t *threads;
    pthread_mutex_t run_mu; /* one loop at a time */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    _Atomic uint64_t generation; /* bumped (under mu) for each loop; workers wait for a new one */
    _Atomic int stop;
    /* the current loop: fn and ctx are read only by a thread holding an unfinished index of it */
    cpu_task_fn fn;
    void *ctx;
    uint32_t loop;            /* the caller's count of loops (the claims' high half) */
    _Atomic uint64_t limit;   /* loop << 32 | its index count: read with the loop's number, so a late
                                 worker never pairs an old claim with a later loop's count */
    _Atomic uint64_t claim;   /* loop << 32 | next index to hand out */
    _Atomic int64_t finished; /* indices of the current loop done */
};

typedef struct worker_arg {
    cpu_threadpool *tp;
    int32_t id;
} worker_arg;

/* Takes and runs indices of loop `loop` until none is left. The thread that finishes the last index wakes
 * the caller, which may be asleep on `done` (it checks under mu). Returns at once for a later loop. */
static void drain(cpu_threadpool *tp, int32_t worker, uint32_t loop) {
    uint64_t c = atomic_load_explicit(&tp->claim, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(c >> 32) != loop) return;
        const uint64_t lim = atomic_load_explicit(&tp->limit, memory_order_acquire);
        if ((uint32_t)(lim >> 32) != loop) return;
        const int64_t i = (int64_t)(uint32_t)c, n = (int64_t)(uint32_t)lim;
        if (i >= n) return;
        if (!atomic_compare_exchange_weak_explicit(&tp->claim, &c, c + 1, memory_order_acq_rel, memory_order_acquire))
            continue;
        tp->fn(tp->ctx, i, worker);
        if (atomic_fetch_add_explicit(&tp->finished, 1, memory_order_acq_rel) + 1 == n && worker != 0) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done);
            pthread_mutex_unlock(&tp->mu);
        }
        c = atomic_load_explicit(&tp->claim, memory_order_acquire);
    }
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__)
    __asm__ volatile("pause");
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* Spins until done(tp, arg) holds or tp->spin_ns pass; returns whether it holds. Every 64 turns it yields the
 * core: when the thread it waits for shares this core (more threads than free cores), spinning would
 * otherwise hold that thread off for a whole time slice. */
static int spin_until(cpu_threadpool *tp, int (*done)(cpu_threadpool *, uint64_t), uint64_t arg) {
    if (tp->spin_ns <= 0) return done(tp, arg);
    const int64_t t0 = now_ns();
    for (int i = 1;; i++) {
        if (done(tp, arg)) return 1;
        cpu_relax();
        if ((i & 63) == 0) {
            if (now_ns() - t0 > tp->spin_ns) return 0;
            sched_yield();
        }
    }
}

static int new_loop(cpu_threadpool *tp, uint64_t seen) {
    return atomic_load_explicit(&tp->stop, memory_order_acquire) ||
           atomic_load_explicit(&tp->generation, memory_order_acquire) != seen;
}

static int loop_done(cpu_threadpool *tp, uint64_t n) {
    return atomic_load_explicit(&tp->finished, memory_order_acquire) == (int64_t)n;
}

static void *worker_main(void *p) {
    worker_arg arg = *(worker_arg *)p;
    free(p);
    cpu_threadpool *tp = arg.tp;
    uint64_t seen = 0;
    for (;;) {
        if (!spin_until(tp, new_loop, seen)) {
            pthread_mutex_lock(&tp->mu);
            while (!new_loop(tp, seen)) pthread_cond_wait(&tp->wake, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load_explicit(&tp->stop, memory_order_acquire)) break;
        seen = atomic_load_explicit(&tp->generation, memory_order_acquire);
        /* the claim is published before the generation: this is the current loop, or a later one */
        drain(tp, arg.id, (uint32_t)(atomic_load_explicit(&tp->claim, memory_order_acquire) >> 32));
    }
    return NULL;
}

/* GOKV_CPU_SPIN_US when it is a whole number of microseconds (capped at 100 s), else the default. */
static int64_t spin_from_env(void) {
    const char *v = getenv("GOKV_CPU_SPIN_US");
    if (!v || !*v) return CPU_SPIN_NS_DEFAULT;
    char *end;
    const long long us = strtoll(v, &end, 10);
    if (*end || us < 0) {
        gokv_log(GOKV_LOG_WARN, "cpu", "device_open", "ignoring GOKV_CPU_SPIN_US=\"%s\" (not a whole number of microseconds)", v);
        return CPU_SPIN_NS_DEFAULT;
    }
    return us > CPU_SPIN_NS_MAX / 1000 ? CPU_SPIN_NS_MAX : (int64_t)us * 1000;
}

cpu_threadpool *cpu_threadpool_create(int32_t n_threads) {
    if (n_threads < 1) n_threads = 1;
    cpu_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n_threads = n_threads;
    tp->spin_ns = spin_from_env();
    pthread_mutex_init(&tp->run_mu, NULL);
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    pthread_cond_init(&tp->done, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof *tp->threads);
    if (!tp->threads) {
        cpu_threadpool_destroy(tp);
        return NULL;
    }
    for (int32_t i = 1; i < n_threads; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (!arg) {
            tp->n_threads = i;
            cpu_threadpool_destroy(tp);
            return NULL;
        }
        arg->tp = tp;
        arg->id = i;
        if (pthread_create(&tp->threads[i], NULL, worker_main, arg) != 0) {
            free(arg);
            tp->n_threads = i;
            cpu_threadpool_destroy(tp);
            return NULL;
        }
    }
    return tp;
}

void cpu_threadpool_destroy(cpu_threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store_explicit(&tp->stop, 1, memory_order_release);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    for (int32_t i = 1; i < tp->n_threads && tp->threads; i++) pthread_join(tp->threads[i], NULL);
    free(tp->threads);
    pthread_cond_destroy(&tp->wake);
    pthread_cond_destroy(&tp->done);
    pthread_mutex_destroy(&tp->mu);
    pthread_mutex_destroy(&tp->run_mu);
    free(tp);
}

int32_t cpu_threadpool_size(const cpu_threadpool *tp) { return tp->n_threads; }

void cpu_threadpool_run(cpu_threadpool *tp, int64_t n, cpu_task_fn fn, void *ctx) {
    if (n <= 0) return;
    pthread_mutex_lock(&tp->run_mu);
    if (tp->n_threads == 1 || n == 1 || n >= UINT32_MAX) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
        pthread_mutex_unlock(&tp->run_mu);
        return;
    }
    /* Every index of the last loop is done, so no thread reads fn or ctx now. The loop is published by
     * the claim's release store; late workers of the last loop see its new generation and take nothing. */
    tp->fn = fn;
    tp->ctx = ctx;
    const uint32_t loop = ++tp->loop;
    atomic_store_explicit(&tp->limit, (uint64_t)loop << 32 | (uint64_t)n, memory_order_relaxed);
    atomic_store_explicit(&tp->finished, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->claim, (uint64_t)loop << 32, memory_order_release);
    pthread_mutex_lock(&tp->mu); /* sleeping workers check under it */
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_release);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    drain(tp, 0, loop);
    if (!spin_until(tp, loop_done, (uint64_t)n)) {
        pthread_mutex_lock(&tp->mu);
        while (!loop_done(tp, (uint64_t)n)) pthread_cond_wait(&tp->done, &tp->mu);
        pthread_mutex_unlock(&tp->mu);
    }
    pthread_mutex_unlock(&tp->run_mu);
}
