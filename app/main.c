/* main.c - the ddpmd binary: the OpenMP wait policy first, then the command line (cli.c). */
#include "cli.h"
#include "cpu/cpu.h"

int main(int argc, char **argv)
{
    cpu_omp_wait_policy(argv); /* OpenMP's wait policy, before libgomp starts */
    return cli_main(argc, argv);
}
