/* testhold.h - a test-only knob that lets a test hold a training run at a step it chooses, so
 * tests wait for progress they control instead of guessing how fast a step is: with
 * DDPMD_TEST_HOLD_STEP=N and DDPMD_TEST_HOLD_FILE=PATH in its environment, a run that has just
 * finished step N waits there (its progress and checkpoint of step N already out) until PATH
 * exists or a stop is asked for. Without both variables it costs one getenv per run.
 * Likewise DDPMD_TEST_HOLD_PLAN_FILE=PATH in the server's environment holds every admission
 * planning (on its worker thread, before it plans) until PATH exists, so a test fills the
 * planning queue for as long as it chooses; DDPMD_TEST_HOLD_UPLOAD_FILE=PATH holds every
 * upload's unpacking (on its HTTP thread, before it unpacks) until PATH exists or a minute has
 * passed, so a test keeps an HTTP thread busy.
 */
#ifndef DDPMD_TESTHOLD_H
#define DDPMD_TESTHOLD_H

#include <signal.h>
#include <stdint.h>

/* called after each finished step; returns at once unless step is the held one */
void testhold_after_step(int64_t step, volatile sig_atomic_t *stop);
/* called by an admission planning before it plans; returns at once unless the variable is set,
 * else once its file exists or stopping(arg) says the server stops */
void testhold_before_plan(int (*stopping)(const void *arg), const void *arg);
/* called by an upload before it unpacks; returns at once unless the variable is set */
void testhold_before_unpack(void);

/* A test-only record of a job's peak resident bytes by phase: with DDPMD_TEST_PEAK_DIR=DIR in its
 * environment, appends "PHASE VmHWM-kB VmRSS-kB" to DIR/peak-PID.txt (its first line "job JOB":
 * the job's output), so a test compares what the process held with its reservation
 * (tests/integration/test_host_peak.py). Without the variable it costs one getenv. */
void testhold_phase(const char *job, const char *phase);

#endif
