/* cli.h - the ddpmd command line: train, sample, export, plan, demo and serve (serve.h). */
#ifndef DDPMD_CLI_H
#define DDPMD_CLI_H

/* argv[1] is the command; returns the process exit status (child.h: 130 stopped, 3 poisoned) */
int cli_main(int argc, char **argv);

/* The one way every command reports a command-line word it cannot take, on stderr:
 * "ddpmd CMD: unknown option '--thread'; did you mean --threads? (ddpmd CMD --help lists the
 * options)", "ddpmd CMD: --out needs a value (...)" when arg is one of known without its value,
 * "ddpmd CMD: unexpected argument 'x' (...)" for a word that is no option. known: the command's
 * options (NULL-terminated); the suggestion is the nearest within a few edits. */
void cli_option_error(const char *cmd, const char *arg, const char *const *known);

#endif
