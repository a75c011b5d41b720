/* worker.h - a small fixed pool of threads over a bounded queue, for work that must not run on
 * an HTTP thread (a job's admission planning, an upload's image decoding): a task that finds
 * the queue full is refused at once (the caller answers 503), never queued without bound.
 */
#ifndef DDPMD_WORKER_H
#define DDPMD_WORKER_H

enum worker_status {
    WORKER_OK = 0,
    WORKER_ERR_FULL,        /* queue_max tasks wait already: refused, nothing queued */
    WORKER_ERR_STOPPED,     /* worker_stop has begun */
    WORKER_ERR_START,       /* out of memory, or a thread could not be made */
};

/* a task: runs once on a worker thread; canceled = 1 when worker_stop drops it before it ran
 * (it must then only release what arg holds) */
typedef void (*worker_fn)(void *arg, int canceled);

struct worker;

/* threads >= 1 threads taking tasks in order; at most queue_max >= 0 tasks wait beyond those
 * running (so threads + queue_max are in flight at most) */
int worker_start(struct worker **out, int threads, int queue_max);
/* queues fn(arg, 0); WORKER_ERR_FULL at once when the queue is full (fn is then not called) */
int worker_submit(struct worker *w, worker_fn fn, void *arg);
/* whether worker_stop has begun (a long task may poll it to end early) */
int worker_stopping(const struct worker *w);
/* the tasks waiting and running now */
int worker_in_flight(struct worker *w);
/* refuses new tasks (worker_submit: WORKER_ERR_STOPPED from now on), calls every waiting one
 * with canceled = 1, waits for the running ones and joins the threads; w stays valid (a late
 * submit is still answered) until worker_free. NULL is a no-op; a second call too */
void worker_stop(struct worker *w);
/* worker_stop, then frees; NULL is a no-op */
void worker_free(struct worker *w);

#endif
