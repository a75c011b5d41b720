/* main.c - the ddpmd command line. */
#define _DEFAULT_SOURCE
#include <stdlib.h>
#include <unistd.h>

#include "cli.h"

int main(int argc, char **argv)
{
    /* OpenMP threads that spin at barriers (libgomp's default) starve each other when the cores
     * are shared with other jobs: measured 2.5 vs 15 images/s on a loaded 2-core machine. The
     * policy is read when libgomp loads, before main, so set it and start again once; an
     * explicit OMP_WAIT_POLICY=ACTIVE (a dedicated machine) is respected. */
    if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "PASSIVE", 1) == 0)
        execv("/proc/self/exe", argv); /* returns only on failure: carry on as we are */
    return cli_main(argc, argv);
}
