/* mcompile_main.c - the mcompile program: dispatch to subcommands.
 *
 *   mcompile merge BASE --lora DIR[:W] ... -o OUT     (cli_merge.c)
 *   mcompile plan MODEL_OR_CONFIG --target SIZE ...   (cli_plan.c)
 *   mcompile inspect ARTIFACT [--verify] [--json]     (cli_inspect.c)
 *   mcompile eval ARTIFACT --ref MODEL --tokens FILE  (cli_eval.c)
 *   mcompile export INPUT --format F -o OUT          (cli_export.c)
 *   mcompile MODEL --target SIZE [-o OUT.mca] ...     (cli_compile.c)
 */
#include <stdio.h>
#include <string.h>

#include "cmp_cli.h"
#include "fmt_atomic.h"
#include "fmt_input.h"
#include "fmt_mapguard.h"
#include "mc_alloc.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

/* One line per subcommand; a subcommand's file adds its entry here. */
static const command commands[] = {
    {"merge", cmp_cli_merge, "merge PEFT LoRA adapters into base weights"},
    {"plan", cmp_cli_plan, "memory plan of a model for a target size"},
    {"inspect", cmp_cli_inspect, "show (and --verify) a compiled artifact"},
    {"eval", cmp_cli_eval, "quantization quality: KLD, top-1, perplexity"},
    {"export", cmp_cli_export, "write GGUF (llama.cpp) or compressed-tensors"},
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: mcompile MODEL --target SIZE [-o OUT.mca] [options]\n"
            "       mcompile COMMAND [options]   (COMMAND --help for more)\n\n"
            "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n  --version  print the version\n  --help     this text\n");
}

int main(int argc, char **argv)
{
    mc_alloc_install_jansson();
    fmt_atomic_install_signal_handlers();
    fmt_mapguard_install();
    fmt_input_begin_run(); /* never replace what this run reads */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("mcompile %s\n", MC_VERSION);
        return 0;
    }
    int rc = -1;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            rc = commands[i].run(argc - 1, argv + 1);
    /* No subcommand: compile MODEL into an artifact. */
    if (rc < 0)
        rc = cmp_cli_compile(argc, argv);
    /* Writers refuse at commit; a command that only printed (inspect,
     * eval) read zeros from a file that shrank: say so, and fail. */
    mc_error e;
    if (rc == 0 && fmt_mapguard_check(&e) != MC_OK) {
        char buf[1600];
        fprintf(stderr, "mcompile: %s\n", mc_error_format(&e, buf, sizeof buf));
        rc = 1;
    }
    return rc;
}
