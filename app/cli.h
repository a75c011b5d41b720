/* cli.h - the ddpmd command line: train, sample, export, plan, demo and serve (serve.h). */
#ifndef DDPMD_CLI_H
#define DDPMD_CLI_H

/* argv[1] is the command; returns the process exit status (child.h: 130 stopped, 3 poisoned) */
int cli_main(int argc, char **argv);

#endif
