/* cli.h - ddpmd's subcommands (plan, demo). */
#ifndef DDPMD_CLI_H
#define DDPMD_CLI_H

int cli_main(int argc, char **argv);

/* the exit status of a command whose device a sticky CUDA error poisoned (ddpmd serve's pool
 * tells it from a failed job's 1 and marks the device) */
#define CLI_EXIT_POISONED 3

#endif
