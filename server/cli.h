/* cli.h - ddpmd's subcommands (plan, demo). */
#ifndef DDPMD_CLI_H
#define DDPMD_CLI_H

int cli_main(int argc, char **argv);

#endif
