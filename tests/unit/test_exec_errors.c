/* test_exec_errors.c - the executor's failure paths: canaries around the workspace catch a kernel
 * writing past its end or before its start (EXEC_ERR_GUARD), and a backend failure keeps its
 * cause: memory refused is EXEC_ERR_BUDGET, a device error EXEC_ERR_BACKEND, both with the
 * backend's own status, the op and a message (a wrapper backend plants each failure).
 */
#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "memplan.h"
#include "test_util.h"

/* ---- the CPU backend with planted faults ---- */

enum fault {
    FAULT_NONE = 0,
    FAULT_WS_PAST_END,  /* conv2d_fwd writes one float just past the workspace */
    FAULT_WS_BEFORE,    /* ... just before it */
    FAULT_ALLOC_NOMEM,  /* mem_alloc refuses the reservation */
    FAULT_ALLOC_DEVICE, /* mem_alloc fails with a device error */
    FAULT_KERNEL_DEVICE, /* conv2d_fwd fails with a device error */
    FAULT_KERNEL_NOMEM, /* conv2d_fwd: a library's allocation beyond the reservation refused */
};
static enum fault fault;
static size_t ws_bytes; /* the plan's, for the planted overwrite */
static struct backend faulty;

static int faulty_alloc(void **out, size_t bytes, bk_ctx *ctx)
{
    if (fault == FAULT_ALLOC_NOMEM) return BK_ERR_NOMEM;
    if (fault == FAULT_ALLOC_DEVICE) return BK_ERR_DEVICE;
    return backend_cpu()->mem_alloc(out, bytes, ctx);
}

static int faulty_conv(void *y, const void *x, const void *w, const float *b, void *ws,
                       const struct bk_conv2d *s, bk_ctx *ctx)
{
    if (fault == FAULT_KERNEL_DEVICE) return BK_ERR_DEVICE;
    if (fault == FAULT_KERNEL_NOMEM) return BK_ERR_NOMEM;
    int rc = backend_cpu()->conv2d_fwd(y, x, w, b, ws, s, ctx);
    float v = 1.0f;
    if (fault == FAULT_WS_PAST_END) memcpy((char *)ws + ws_bytes, &v, sizeof v);
    if (fault == FAULT_WS_BEFORE) memcpy((char *)ws - sizeof v, &v, sizeof v);
    return rc;
}

struct job {
    struct graph g;
    struct plan p;
    int x, target, conv_op;
};

/* conv (3 -> 4 channels, 3x3) then MSE, with its backward */
static int job_build(struct job *j, size_t guard)
{
    memset(j, 0, sizeof *j);
    graph_init(&j->g);
    int xd[4] = {2, 3, 8, 8}, wd[4] = {4, 3, 3, 3}, bd[1] = {4}, yd[4] = {2, 4, 8, 8};
    j->x = graph_input(&j->g, "x", 4, xd);
    int w = graph_param(&j->g, "conv.weight", 4, wd);
    int b = graph_param(&j->g, "conv.bias", 1, bd);
    j->target = graph_input(&j->g, "target", 4, yd);
    j->conv_op = j->g.n_ops;
    int y = graph_conv2d(&j->g, j->x, w, b, 1, 1, 1, 1, 1);
    int loss = graph_mse(&j->g, y, j->target);
    if (loss < 0 || graph_backward(&j->g, loss)) return -1;
    struct plan_opts po = {.guard_bytes = guard};
    return plan_make(&j->p, &j->g, &faulty, &po);
}

static void job_free(struct job *j)
{
    plan_free(&j->p);
    graph_free(&j->g);
}

/* one step with the fault planted: its status, and the exec's last error in *err */
static int step(struct job *j, enum fault f, int check_guards, struct exec_error *err)
{
    struct exec *e = NULL;
    struct exec_opts eo = {.threads = 1, .check_guards = check_guards, .init_error = err};
    memset(err, 0, sizeof *err);
    fault = f;
    int rc = exec_init(&e, &j->g, &j->p, &faulty, &eo);
    if (rc) {
        fault = FAULT_NONE;
        CHECK(e == NULL, "a failed exec_init left an executor");
        return rc;
    }
    float xs[2 * 3 * 8 * 8], ts[2 * 4 * 8 * 8], loss = 0;
    tu_seed(3);
    tu_fill(xs, sizeof xs / sizeof *xs, 1.0);
    tu_fill(ts, sizeof ts / sizeof *ts, 1.0);
    rc = exec_upload(e, j->x, xs);
    if (!rc) rc = exec_upload(e, j->target, ts);
    if (!rc) rc = exec_forward_backward(e, 1, 1.0f, 1, 0, 0, &loss);
    *err = *exec_last_error(e);
    fault = FAULT_NONE;
    exec_free(e);
    return rc;
}

/* 2. the workspace's canaries */
static void workspace_guards(void)
{
    struct job j;
    CHECK(job_build(&j, 64) == 0, "build");
    ws_bytes = j.p.ws_bytes;
    printf("workspace %zu bytes at %zu, canaries of %zu bytes on each side, arena at %zu\n",
           j.p.ws_bytes, j.p.ws_off, j.p.ws_guard_bytes, j.p.arena_off);
    CHECK(j.p.ws_guard_bytes >= 64 && j.p.ws_off >= j.p.inputs_off + j.p.inputs_bytes + 64 &&
              j.p.arena_off >= j.p.ws_off + j.p.ws_bytes + 64,
          "no gap around the workspace: inputs end %zu, ws [%zu, %zu), arena %zu",
          j.p.inputs_off + j.p.inputs_bytes, j.p.ws_off, j.p.ws_off + j.p.ws_bytes,
          j.p.arena_off);
    struct exec_error err;
    int rc = step(&j, FAULT_NONE, 1, &err);
    CHECK(rc == EXEC_OK && err.status == EXEC_OK, "a clean step with canaries: %d (%s)", rc,
          err.msg);
    rc = step(&j, FAULT_WS_PAST_END, 1, &err);
    CHECK(rc == EXEC_ERR_GUARD && err.status == EXEC_ERR_GUARD && err.op == j.conv_op &&
              strstr(err.msg, "past the end of the workspace"),
          "a write past the workspace's end: rc %d, op %d (conv is op %d): %s", rc, err.op,
          j.conv_op, err.msg);
    rc = step(&j, FAULT_WS_BEFORE, 1, &err);
    CHECK(rc == EXEC_ERR_GUARD && err.op == j.conv_op && strstr(err.msg, "before the workspace"),
          "a write before the workspace: rc %d, op %d: %s", rc, err.op, err.msg);
    /* the same overwrite unchecked: nothing is noticed (the check is what catches it) */
    rc = step(&j, FAULT_WS_PAST_END, 0, &err);
    CHECK(rc == EXEC_OK, "without check_guards the step runs: %d", rc);
    job_free(&j);

    /* without guard_bytes the plan has no gaps, as before */
    CHECK(job_build(&j, 0) == 0, "build");
    CHECK(j.p.ws_guard_bytes == 0 && j.p.arena_off == j.p.ws_off + j.p.ws_bytes &&
              j.p.ws_off == j.p.inputs_off + j.p.inputs_bytes,
          "gaps without guard_bytes");
    job_free(&j);
}

/* 3. out of budget and device errors stay apart, with the backend's status */
static void backend_failures(void)
{
    struct job j;
    CHECK(job_build(&j, 0) == 0, "build");
    struct exec_error err;
    int rc = step(&j, FAULT_ALLOC_NOMEM, 0, &err);
    char bytes[32];
    snprintf(bytes, sizeof bytes, "%zu bytes", j.p.total_bytes);
    CHECK(rc == EXEC_ERR_BUDGET && err.status == EXEC_ERR_BUDGET && err.bk_status == BK_ERR_NOMEM &&
              err.op == -1 && strstr(err.msg, bytes) && strstr(err.msg, "cpu"),
          "the reservation refused: rc %d, bk %d: %s", rc, err.bk_status, err.msg);
    rc = step(&j, FAULT_ALLOC_DEVICE, 0, &err);
    CHECK(rc == EXEC_ERR_BACKEND && err.bk_status == BK_ERR_DEVICE && strstr(err.msg, bytes),
          "the reservation failing with a device error: rc %d, bk %d: %s", rc, err.bk_status,
          err.msg);
    rc = step(&j, FAULT_KERNEL_DEVICE, 0, &err);
    CHECK(rc == EXEC_ERR_BACKEND && err.bk_status == BK_ERR_DEVICE && err.op == j.conv_op &&
              strstr(err.msg, "conv2d"),
          "a kernel's device error: rc %d, bk %d, op %d: %s", rc, err.bk_status, err.op, err.msg);
    rc = step(&j, FAULT_KERNEL_NOMEM, 0, &err);
    CHECK(rc == EXEC_ERR_BUDGET && err.bk_status == BK_ERR_NOMEM && err.op == j.conv_op,
          "a kernel's allocation refused: rc %d, bk %d, op %d: %s", rc, err.bk_status, err.op,
          err.msg);
    CHECK(strcmp(exec_status_name(EXEC_ERR_BUDGET), "out of budget") == 0 &&
              strcmp(exec_status_name(EXEC_ERR_BACKEND), "backend error") == 0,
          "status names");

#if !defined(__SANITIZE_ADDRESS__)
    /* the CPU backend's own allocator refusing a reservation no machine has (ASan would report
     * the request itself instead of returning NULL) */
    size_t keep = j.p.total_bytes;
    j.p.total_bytes = (size_t)1 << 62;
    struct exec *e = NULL;
    memset(&err, 0, sizeof err);
    rc = exec_init(&e, &j.g, &j.p, backend_cpu(), &(struct exec_opts){.threads = 1, .init_error = &err});
    CHECK(rc == EXEC_ERR_BUDGET && e == NULL && err.bk_status == BK_ERR_NOMEM,
          "the CPU allocator refusing 4 EiB: rc %d (%s)", rc, err.msg);
    j.p.total_bytes = keep;
#endif
    job_free(&j);
}

int main(void)
{
    faulty = *backend_cpu();
    faulty.mem_alloc = faulty_alloc;
    faulty.conv2d_fwd = faulty_conv;
    workspace_guards();
    backend_failures();
    return tu_finish("test_exec_errors");
}
