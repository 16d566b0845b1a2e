/* threadpool.c: see threadpool.h. Indices are handed out by an atomic counter, so uneven work balances. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "threadpool.h"

struct cpu_threadpool {
    int32_t n_threads;
    pthread_t *threads;
    pthread_mutex_t run_mu; /* one loop at a time */
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    uint64_t generation;    /* bumped for each loop; workers wait for a new one */
    int32_t active;         /* workers still inside the current loop */
    int stop;
    /* the current loop */
    cpu_task_fn fn;
    void *ctx;
    int64_t n;
    _Atomic int64_t next;
};

typedef struct worker_arg {
    cpu_threadpool *tp;
    int32_t id;
} worker_arg;

static void drain(cpu_threadpool *tp, int32_t worker) {
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&tp->next, 1, memory_order_relaxed);
        if (i >= tp->n) return;
        tp->fn(tp->ctx, i, worker);
    }
}

static void *worker_main(void *p) {
    worker_arg arg = *(worker_arg *)p;
    free(p);
    cpu_threadpool *tp = arg.tp;
    uint64_t seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->stop && tp->generation == seen) pthread_cond_wait(&tp->wake, &tp->mu);
        if (tp->stop) break;
        seen = tp->generation;
        pthread_mutex_unlock(&tp->mu);
        drain(tp, arg.id);
        pthread_mutex_lock(&tp->mu);
        if (--tp->active == 0) pthread_cond_signal(&tp->done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

cpu_threadpool *cpu_threadpool_create(int32_t n_threads) {
    if (n_threads < 1) n_threads = 1;
    cpu_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return NULL;
    tp->n_threads = n_threads;
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
    tp->stop = 1;
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
    if (tp->n_threads == 1 || n == 1) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i, 0);
        pthread_mutex_unlock(&tp->run_mu);
        return;
    }
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n = n;
    atomic_store_explicit(&tp->next, 0, memory_order_relaxed);
    tp->active = tp->n_threads - 1;
    tp->generation++;
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    drain(tp, 0);
    pthread_mutex_lock(&tp->mu);
    while (tp->active > 0) pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    pthread_mutex_unlock(&tp->run_mu);
}
