/* worker.c - the bounded worker pool (see worker.h): a ring of tasks under one mutex, threads
 * that wait on a condition variable, and the heap given back to the system after each task
 * (glibc keeps freed arenas otherwise: a plan of 700 MB would stay in the server's RSS).
 */
#define _GNU_SOURCE
#include "worker.h"

#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>

struct task {
    worker_fn fn;
    void *arg;
};

struct worker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t *threads;
    int n_threads;
    struct task *ring;      /* queue_max slots (at least 1 allocated) */
    int cap, head, n;       /* the waiting tasks: ring[head .. head + n) mod cap */
    int queue_max, running;
    volatile int stopping;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->n && !w->stopping) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->n) break; /* stopping, nothing left */
        struct task t = w->ring[w->head];
        w->head = (w->head + 1) % w->cap;
        w->n--;
        w->running++;
        int canceled = w->stopping;
        pthread_mutex_unlock(&w->mu);
        t.fn(t.arg, canceled);
#ifdef __GLIBC__
        malloc_trim(0);
#endif
        pthread_mutex_lock(&w->mu);
        w->running--;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int worker_start(struct worker **out, int threads, int queue_max)
{
    *out = NULL;
    if (threads < 1 || queue_max < 0) return WORKER_ERR_START;
    struct worker *w = calloc(1, sizeof *w);
    if (!w) return WORKER_ERR_START;
    w->queue_max = queue_max;
    /* the ring also holds the tasks taken by idle threads between submit and their wake-up */
    w->cap = queue_max + threads;
    w->ring = calloc((size_t)w->cap, sizeof *w->ring);
    w->threads = calloc((size_t)threads, sizeof *w->threads);
    if (!w->ring || !w->threads) {
        free(w->ring);
        free(w->threads);
        free(w);
        return WORKER_ERR_START;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    for (; w->n_threads < threads; w->n_threads++)
        if (pthread_create(&w->threads[w->n_threads], NULL, worker_main, w)) {
            worker_free(w);
            return WORKER_ERR_START;
        }
    *out = w;
    return WORKER_OK;
}

int worker_submit(struct worker *w, worker_fn fn, void *arg)
{
    pthread_mutex_lock(&w->mu);
    int rc = WORKER_OK;
    /* in flight: the running tasks and the waiting ones; idle threads take waiting ones at once */
    if (w->stopping)
        rc = WORKER_ERR_STOPPED;
    else if (w->running + w->n >= w->n_threads + w->queue_max || w->n >= w->cap)
        rc = WORKER_ERR_FULL;
    else {
        w->ring[(w->head + w->n) % w->cap] = (struct task){fn, arg};
        w->n++;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return rc;
}

int worker_stopping(const struct worker *w) { return w->stopping; }

int worker_in_flight(struct worker *w)
{
    pthread_mutex_lock(&w->mu);
    int n = w->running + w->n;
    pthread_mutex_unlock(&w->mu);
    return n;
}

void worker_stop(struct worker *w)
{
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_broadcast(&w->cv);
    int n = w->n_threads;
    w->n_threads = 0; /* joined below, once */
    pthread_mutex_unlock(&w->mu);
    /* the threads drain the queue (each task called with canceled = 1) and exit */
    for (int i = 0; i < n; i++) pthread_join(w->threads[i], NULL);
}

void worker_free(struct worker *w)
{
    if (!w) return;
    worker_stop(w);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w->threads);
    free(w->ring);
    free(w);
}
