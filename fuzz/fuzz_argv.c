/* fuzz_argv.c - command lines through the option engine (mc_opt.h): the
 * input, cut at '\n' into words (at most 64), is parsed against a table
 * with a row of every kind.  Any words are accepted or refused, never a
 * crash; an accepted number lies in its row's range; a refusal says why;
 * the help text of the table is always whole. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mc_opt.h"
#include "mc_parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fz {
    const char *pos, *str;
    int on, mode;
    uint32_t u32;
    uint64_t u64;
    int i;
    float f;
    double d;
    int calls;
} fz;

static int on_call(void *base, const mc_opt *row, const char *flag,
                   const char *v, char *why, size_t n)
{
    (void)row, (void)flag, (void)v, (void)why, (void)n;
    ((fz *)base)->calls++;
    return 0;
}

static const mc_opt_choice modes[] = {
    {"a", 1, 0}, {"b", 2, 0}, {"c", 2, 1}, {NULL, 0, 0}};
static const mc_opt sub[] = {
    {.kind = MC_OPT_F64, .flags = "--d", .value = "D",
     .off = offsetof(fz, d), .flo = 0, .fhi = 1, .fflags = MC_PARSE_LO_OPEN,
     .help = "d"},
    {.kind = MC_OPT_END}};
static const mc_opt rows[] = {
    {.kind = MC_OPT_SECTION, .help = "S:"},
    {.kind = MC_OPT_STR, .flags = "-s, --str", .value = "S",
     .off = offsetof(fz, str), .help = "s\nt"},
    {.kind = MC_OPT_SET, .flags = "--on", .off = offsetof(fz, on), .help = ""},
    {.kind = MC_OPT_CLEAR, .flags = "--off", .off = offsetof(fz, on)},
    {.kind = MC_OPT_U32, .flags = "--u32", .value = "N",
     .off = offsetof(fz, u32), .ulo = 1, .uhi = 65536, .help = "u"},
    {.kind = MC_OPT_U64, .flags = "--u64", .value = "N",
     .off = offsetof(fz, u64), .ulo = 0, .uhi = UINT64_MAX, .help = "u"},
    {.kind = MC_OPT_INT, .flags = "--i", .value = "N", .off = offsetof(fz, i),
     .ulo = 1, .uhi = 256, .help = "i"},
    {.kind = MC_OPT_F32, .flags = "--f", .value = "F", .off = offsetof(fz, f),
     .flo = -1e4, .fhi = 1e4, .help = "f"},
    {.kind = MC_OPT_CHOICE, .flags = "--mode", .value = "a|b",
     .off = offsetof(fz, mode), .choices = modes, .help = "m"},
    {.kind = MC_OPT_CALL, .flags = "--call", .value = "X", .call = on_call,
     .help = "c"},
    {.kind = MC_OPT_TABLE, .sub = sub},
    {.kind = MC_OPT_HELP, .flags = "-h, --help", .help = "h"},
    {.kind = MC_OPT_END}};
static const mc_opt_cmd cmd = {.name = "fz", .usage = "usage: fz\n",
                               .positional = "P",
                               .positional_off = offsetof(fz, pos),
                               .opts = rows};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0'; /* words are C strings: one ends at a NUL */
    char *argv[65] = {"fz"};
    int argc = 1;
    for (char *p = s; argc < 65;) {
        argv[argc++] = p;
        char *nl = strchr(p, '\n');
        if (!nl)
            break;
        *nl = '\0';
        p = nl + 1;
    }
    fz v;
    memset(&v, 0, sizeof v);
    char why[256] = "";
    int r = mc_opt_parse(&cmd, argc, argv, &v, why, sizeof why);
    if (r == 0) {
        if ((v.u32 && v.u32 > 65536) || v.i < 0 || v.i > 256 ||
            !isfinite(v.f) || fabsf(v.f) > 1e4f || v.d < 0 || v.d > 1 ||
            v.mode < 0 || v.mode > 2)
            abort();
    } else if (r < 0 && why[0] == '\0') {
        abort();
    }
    char *h = mc_opt_help(&cmd);
    if (!h || !strstr(h, "--mode a|b"))
        abort();
    free(h);
    free(s);
    return 0;
}
