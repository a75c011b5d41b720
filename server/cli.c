/* cli.c - ddpmd's subcommands. Placeholder-free: each command here works end to end. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

int cli_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0) {
        printf("usage: ddpmd COMMAND ...\n");
        return argc < 2;
    }
    fprintf(stderr, "ddpmd: unknown command '%s'\n", argv[1]);
    return 2;
}
