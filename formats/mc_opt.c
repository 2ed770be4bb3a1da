/* mc_opt.c - option tables: parsing and --help (see mc_opt.h). */
#include "mc_opt.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mc_parse.h"

/* 1 if name (len bytes) is one of the ", "-separated names of flags. */
static int names_match(const char *flags, const char *name, size_t len)
{
    const char *p = flags;
    while (p && *p) {
        size_t l = strcspn(p, ",");
        if (l == len && memcmp(p, name, len) == 0)
            return 1;
        p += l;
        p += strspn(p, ", ");
    }
    return 0;
}

/* The row of flag name[0..len) and the base its field is relative to. */
static const mc_opt *find_row(const mc_opt *t, const char *name, size_t len,
                              char *base, char **row_base)
{
    for (; t && t->kind != MC_OPT_END; t++) {
        if (t->kind == MC_OPT_TABLE) {
            const mc_opt *r = find_row(t->sub, name, len,
                                       base ? base + t->off : NULL, row_base);
            if (r)
                return r;
        } else if (t->kind != MC_OPT_SECTION && t->flags &&
                   names_match(t->flags, name, len)) {
            *row_base = base;
            return t;
        }
    }
    return NULL;
}

/* "a, b or c": the choices' names for a message. */
static void choice_list(const mc_opt_choice *c, char *buf, size_t n)
{
    size_t k = 0, shown = 0, total = 0;
    for (const mc_opt_choice *p = c; p->name; p++)
        total += !p->alias;
    buf[0] = '\0';
    for (; c->name; c++) {
        if (c->alias)
            continue;
        shown++;
        const char *sep = shown == 1 ? "" : shown == total ? " or " : ", ";
        int w = snprintf(buf + k, n - k, "%s%s", sep, c->name);
        if (w < 0 || (size_t)w >= n - k)
            return;
        k += (size_t)w;
    }
}

/* Store value v of flag into the row's field. */
static int apply(const mc_opt *r, char *base, const char *flag,
                 const char *v, char *why, size_t n)
{
    void *field = base + r->off;
    uint64_t u;
    double d;
    switch (r->kind) {
    case MC_OPT_SET:
    case MC_OPT_CLEAR:
        *(int *)field = r->kind == MC_OPT_SET;
        return 0;
    case MC_OPT_STR:
        *(const char **)field = v;
        return 0;
    case MC_OPT_U32:
    case MC_OPT_U64:
    case MC_OPT_INT:
        if (mc_parse_u64(flag, v, r->ulo, r->uhi, &u, why, n) != 0)
            return -1;
        if (r->kind == MC_OPT_U32)
            *(uint32_t *)field = (uint32_t)u; /* the table's uhi fits */
        else if (r->kind == MC_OPT_U64)
            *(uint64_t *)field = u;
        else
            *(int *)field = (int)u;
        return 0;
    case MC_OPT_F32:
    case MC_OPT_F64:
        if (mc_parse_f64(flag, v, r->flo, r->fhi, r->fflags, &d, why, n) != 0)
            return -1;
        if (r->kind == MC_OPT_F32)
            *(float *)field = (float)d;
        else
            *(double *)field = d;
        return 0;
    case MC_OPT_CHOICE:
        for (const mc_opt_choice *c = r->choices; c && c->name; c++)
            if (strcmp(c->name, v) == 0) {
                *(int *)field = c->value;
                return 0;
            }
        {
            char list[256];
            choice_list(r->choices, list, sizeof list);
            snprintf(why, n, "%s: expected %s, got '%s'", flag, list, v);
        }
        return -1;
    case MC_OPT_CALL:
        return r->call(base, r, flag, v, why, n);
    default:
        snprintf(why, n, "%s: not an option", flag);
        return -1;
    }
}

/* Split "--flag=value": the length of the name; *v the value or NULL. */
static size_t split_eq(const char *a, const char **v)
{
    const char *eq = a[0] == '-' && a[1] == '-' ? strchr(a, '=') : NULL;
    *v = eq ? eq + 1 : NULL;
    return eq ? (size_t)(eq - a) : strlen(a);
}

/* 1 if a is an option word (not "-", not a positional). */
static int is_flag(const char *a)
{
    return a[0] == '-' && a[1] != '\0';
}

/* -h/--help among the options (values skipped, up to "--"). */
static int help_asked(const mc_opt_cmd *cmd, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--") == 0)
            return 0;
        if (!is_flag(a))
            continue;
        size_t len = split_eq(a, &v);
        char *rb = NULL;
        const mc_opt *r = find_row(cmd->opts, a, len, NULL, &rb);
        if (r && r->kind == MC_OPT_HELP)
            return 1;
        if (r && r->value && !v)
            i++; /* its value, whatever it reads */
    }
    return 0;
}

int mc_opt_parse(const mc_opt_cmd *cmd, int argc, char **argv, void *base,
                 char *why, size_t n)
{
    if (help_asked(cmd, argc, argv))
        return MC_OPT_HELP_ASKED;
    int only_positional = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!only_positional && strcmp(a, "--") == 0) {
            only_positional = 1;
            continue;
        }
        if (only_positional || !is_flag(a)) {
            const char **slot =
                cmd->positional
                    ? (const char **)((char *)base + cmd->positional_off)
                    : NULL;
            if (!slot || *slot) {
                snprintf(why, n, "unexpected argument '%s'%s", a,
                         cmd->extra_hint ? cmd->extra_hint : "");
                return -1;
            }
            *slot = a;
            continue;
        }
        size_t len = split_eq(a, &v);
        char *rb = NULL;
        const mc_opt *r = find_row(cmd->opts, a, len, (char *)base, &rb);
        if (!r) {
            snprintf(why, n, "unknown option '%.*s'", (int)len, a);
            return -1;
        }
        char flag[64];
        snprintf(flag, sizeof flag, "%.*s", (int)len, a);
        if (!r->value) {
            if (v) {
                snprintf(why, n, "%s takes no value (got '%s')", flag, v);
                return -1;
            }
        } else if (!v) {
            if (i + 1 >= argc) {
                snprintf(why, n, "%s needs a value (%s)", flag, r->value);
                return -1;
            }
            v = argv[++i];
        }
        if (apply(r, rb, flag, v, why, n) != 0)
            return -1;
    }
    return 0;
}

/* ---- --help ------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (w < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)w < b->cap - b->len) {
            b->len += (size_t)w;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)w + 1;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

/* help's lines, the first after `used` columns, the others at col. */
static void put_help(sbuf *b, const char *help, size_t used, size_t col)
{
    if (!help || !*help) {
        sb_printf(b, "\n");
        return;
    }
    if (used >= col) { /* flags too wide: help on the next line */
        sb_printf(b, "\n");
        used = 0;
    }
    const char *p = help;
    while (*p) {
        size_t l = strcspn(p, "\n");
        sb_printf(b, "%*s%.*s\n", (int)(col - used), "", (int)l, p);
        used = 0;
        p += l;
        if (*p == '\n')
            p++;
    }
}

static void put_rows(sbuf *b, const mc_opt *t, size_t col, int *first)
{
    for (; t && t->kind != MC_OPT_END; t++) {
        if (t->kind == MC_OPT_TABLE) {
            put_rows(b, t->sub, col, first);
            continue;
        }
        if (t->kind == MC_OPT_SECTION) {
            sb_printf(b, "%s%s\n", *first ? "" : "\n", t->help);
            *first = 0;
            continue;
        }
        *first = 0;
        int w0 = (int)b->len;
        sb_printf(b, "  %s%s%s", t->flags, t->value ? " " : "",
                  t->value ? t->value : "");
        size_t used = b->len - (size_t)w0;
        /* one space at least between the flags and their help */
        put_help(b, t->help, used + 1 > col ? col : used, col);
    }
}

char *mc_opt_help(const mc_opt_cmd *cmd)
{
    sbuf b = {malloc(1024), 0, 1024, 0};
    if (!b.p)
        return NULL;
    b.p[0] = '\0';
    size_t col = cmd->help_col > 0 ? (size_t)cmd->help_col : 19;
    int first = 1;
    sb_printf(&b, "%s", cmd->usage ? cmd->usage : "");
    put_rows(&b, cmd->opts, col, &first);
    if (cmd->footer)
        sb_printf(&b, "%s", cmd->footer);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

void mc_opt_each_flag(const mc_opt *t,
                      void (*fn)(const char *flag, const mc_opt *row,
                                 void *ctx),
                      void *ctx)
{
    for (; t && t->kind != MC_OPT_END; t++) {
        if (t->kind == MC_OPT_TABLE) {
            mc_opt_each_flag(t->sub, fn, ctx);
            continue;
        }
        for (const char *p = t->flags; p && *p;) {
            size_t l = strcspn(p, ",");
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)l, p);
            fn(name, t, ctx);
            p += l;
            p += strspn(p, ", ");
        }
    }
}
