/* serve.h - `ddpmd serve`: options (flags and DDPMD_* environment variables), the job store, the
 * device pool and the HTTP api put together; SIGTERM stops admitting, lets running jobs
 * checkpoint and exits.
 */
#ifndef DDPMD_SERVE_H
#define DDPMD_SERVE_H

#include <stdint.h>

/* argv[1] is "serve"; returns the process exit status */
int serve_main(int argc, char **argv);

#endif
