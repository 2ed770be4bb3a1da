/* fmt_peft.c - adapter_config.json parsing and PEFT module selection
 * (contract in fmt_peft.h; the adapter files are read in fmt_peft_open.c). */
#include "fmt_peft.h"

#include <jansson.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <string.h>

#include "mc_alloc.h"

/* ---- Python-style regex -> POSIX ERE --------------------------------- */

/* Translate the Python regex escapes PEFT configs use (\d \w \s, (?:...))
 * into POSIX ERE and anchor the whole thing: "^(?:re)$" semantics is what
 * re.fullmatch gives.  prefix is put before the pattern inside the anchor
 * ("(.*\.)?(" for rank_pattern keys).  Writes into o (cap bytes): no
 * allocation, so matching cannot fail for lack of memory and be mistaken
 * for "no match".  Returns 0, or -1 if the translation might not fit (the
 * pattern is then rejected as too long when the config is parsed). */
#define PEFT_REGEX_MAX 4096
static int to_posix(const char *re, const char *prefix, const char *suffix,
                    char *o, size_t cap)
{
    size_t n = strlen(re);
    if (n > cap / 16 ||
        2 * strlen(prefix) + strlen(suffix) + n * 14 + 8 > cap)
        return -1;
    size_t k = 0;
    o[k++] = '^';
    k += (size_t)snprintf(o + k, cap - k, "%s", prefix);
    for (size_t i = 0; i < n; i++) {
        const char *rep = NULL;
        if (re[i] == '\\' && i + 1 < n) {
            switch (re[i + 1]) {
            case 'd': rep = "[0-9]"; break;
            case 'w': rep = "[A-Za-z0-9_]"; break;
            case 's': rep = "[[:space:]]"; break;
            default: break;
            }
            if (rep) {
                k += (size_t)snprintf(o + k, cap - k, "%s", rep);
                i++;
                continue;
            }
            o[k++] = re[i++];
            o[k++] = re[i];
            continue;
        }
        if (re[i] == '(' && i + 2 < n && re[i + 1] == '?' && re[i + 2] == ':') {
            o[k++] = '(';
            i += 2;
            continue;
        }
        o[k++] = re[i];
    }
    k += (size_t)snprintf(o + k, cap - k, "%s$", suffix);
    return 0;
}

/* Patterns come from untrusted configs, and glibc's regcomp copies the
 * tree of a repeated sub-expression for every stacked or counted
 * repetition: "x++++...++" or "(a{50}){50}" costs gigabytes (found by
 * fuzz_adapter_config).  PEFT's patterns are simple alternations, so accept
 * only tame ones: no quantifier directly after another, counted
 * repetitions {m,n} with m, n <= 16, and at most 32 quantifiers. */
#define PEFT_REGEX_MAX_QUANT 32
#define PEFT_REGEX_MAX_COUNT 16
static int regex_is_tame(const char *re)
{
    int prev_quant = 0, nquant = 0;
    for (size_t i = 0; re[i]; i++) {
        char c = re[i];
        if (c == '\\') {
            if (re[i + 1])
                i++;
            prev_quant = 0;
            continue;
        }
        if (c == '[') { /* bracket expression: quantifier chars are literal */
            size_t j = i + 1;
            if (re[j] == '^')
                j++;
            if (re[j] == ']')
                j++;
            while (re[j] && re[j] != ']')
                j++;
            if (!re[j])
                return 0;
            i = j;
            prev_quant = 0;
            continue;
        }
        int quant = c == '*' || c == '+' || c == '?' || c == '{';
        if (!quant) {
            prev_quant = 0;
            continue;
        }
        /* "(?:" is a group opener, not a quantifier */
        if (c == '?' && i > 0 && re[i - 1] == '(')
            continue;
        if (prev_quant || ++nquant > PEFT_REGEX_MAX_QUANT)
            return 0;
        if (c == '{') {
            unsigned long v = 0;
            size_t j = i + 1;
            for (; re[j] && re[j] != '}'; j++) {
                if (re[j] == ',') {
                    v = 0;
                    continue;
                }
                if (re[j] < '0' || re[j] > '9')
                    return 0;
                v = v * 10 + (unsigned long)(re[j] - '0');
                if (v > PEFT_REGEX_MAX_COUNT)
                    return 0;
            }
            if (!re[j])
                return 0;
            i = j;
        }
        prev_quant = 1;
    }
    return 1;
}

/* 1 if s matches the anchored pattern; -1 if it does not compile. */
static int regex_match(const char *re, const char *prefix, const char *suffix,
                       const char *s)
{
    char p[PEFT_REGEX_MAX];
    if (!regex_is_tame(re) || to_posix(re, prefix, suffix, p, sizeof p) != 0)
        return -1;
    regex_t rx;
    if (regcomp(&rx, p, REG_EXTENDED | REG_NOSUB) != 0)
        return -1;
    int m = regexec(&rx, s, 0, NULL, 0) == 0;
    regfree(&rx);
    return m;
}

static int regex_compiles(const char *re, const char *prefix,
                          const char *suffix)
{
    return regex_match(re, prefix, suffix, "") >= 0;
}

/* ---- module selection ------------------------------------------------- */

static int name_matches(const char *module, const char *entry)
{
    size_t lm = strlen(module), le = strlen(entry);
    if (strcmp(module, entry) == 0)
        return 1;
    return lm > le && module[lm - le - 1] == '.' &&
           strcmp(module + lm - le, entry) == 0;
}

static int select_matches(const fmt_peft_select *s, const char *module,
                          int is_linear)
{
    if (!s->present)
        return 0;
    if (s->all_linear)
        return is_linear;
    if (s->regex)
        return regex_match(s->regex, "(", ")", module) == 1;
    for (size_t i = 0; i < s->n_names; i++)
        if (name_matches(module, s->names[i]))
            return 1;
    return 0;
}

/* Layer index of module: ".<pattern>.<N>." with pattern from
 * layers_pattern, or any component when none is given.  -1 if absent. */
static int64_t layer_index(const fmt_peft_config *c, const char *module)
{
    size_t n = c->n_layers_pattern ? c->n_layers_pattern : 1;
    for (size_t p = 0; p < n; p++) {
        const char *pat = c->n_layers_pattern ? c->layers_pattern[p] : NULL;
        /* Python: re.match(r".*\.{pat}\.(\d+)\.", key) - the last such
         * occurrence, since ".*" is greedy. */
        int64_t found = -1;
        for (const char *q = module; (q = strchr(q, '.')); q++) {
            const char *comp = q + 1;
            const char *dot = strchr(comp, '.');
            if (!dot)
                break;
            if (pat && ((size_t)(dot - comp) != strlen(pat) ||
                        strncmp(comp, pat, strlen(pat)) != 0))
                continue;
            const char *d = dot + 1;
            const char *e = d;
            while (*e >= '0' && *e <= '9')
                e++;
            if (e == d || *e != '.' || e - d > 9)
                continue;
            found = 0;
            for (const char *x = d; x < e; x++)
                found = found * 10 + (*x - '0');
        }
        if (found >= 0)
            return found;
    }
    return -1;
}

int fmt_peft_selects(const fmt_peft_config *c, const char *module,
                     int is_linear)
{
    if (!c || !module)
        return 0;
    if (select_matches(&c->exclude, module, is_linear))
        return 0;
    if (!select_matches(&c->target, module, is_linear))
        return 0;
    /* As in PEFT, layers_to_transform only narrows list targets. */
    if (c->layers && !c->target.regex) {
        int64_t li = layer_index(c, module);
        if (li < 0)
            return 0;
        for (size_t i = 0; i < c->n_layers; i++)
            if (c->layers[i] == li)
                return 1;
        return 0;
    }
    return 1;
}

static const fmt_peft_pattern *find_pattern(const fmt_peft_pattern *p,
                                            size_t n, const char *module)
{
    for (size_t i = 0; i < n; i++)
        if (regex_match(p[i].key, "(.*\\.)?(", ")", module) == 1)
            return &p[i];
    return NULL;
}

void fmt_peft_module_params(const fmt_peft_config *c, const char *module,
                            uint32_t *r, double *alpha, double *scaling)
{
    const fmt_peft_pattern *pr =
        find_pattern(c->rank_pattern, c->n_rank_pattern, module);
    const fmt_peft_pattern *pa =
        find_pattern(c->alpha_pattern, c->n_alpha_pattern, module);
    uint32_t rr = pr ? (uint32_t)pr->value : c->r;
    double aa = pa ? pa->value : c->lora_alpha;
    if (r)
        *r = rr;
    if (alpha)
        *alpha = aa;
    if (scaling)
        *scaling = c->use_rslora ? aa / sqrt((double)rr) : aa / (double)rr;
}

/* ---- adapter_config.json ---------------------------------------------- */

typedef struct pctx {
    const char *name;
    mc_error *err;
} pctx;

static void free_strv(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        mc_free(v[i]);
    mc_free(v);
}

static void free_select(fmt_peft_select *s)
{
    mc_free(s->regex);
    free_strv(s->names, s->n_names);
    memset(s, 0, sizeof *s);
}

static void free_patterns(fmt_peft_pattern *p, size_t n)
{
    for (size_t i = 0; p && i < n; i++)
        mc_free(p[i].key);
    mc_free(p);
}

void fmt_peft_config_free(fmt_peft_config *c)
{
    if (!c)
        return;
    free_select(&c->target);
    free_select(&c->exclude);
    mc_free(c->layers);
    free_strv(c->layers_pattern, c->n_layers_pattern);
    free_patterns(c->rank_pattern, c->n_rank_pattern);
    free_patterns(c->alpha_pattern, c->n_alpha_pattern);
    free_strv(c->modules_to_save, c->n_modules_to_save);
    memset(c, 0, sizeof *c);
}

static mc_status nomem(pctx *p)
{
    return mc_fail(p->err, MC_ERR_NOMEM, p->name, NULL, -1, "out of memory");
}

static mc_status get_bool(pctx *p, json_t *o, const char *key, int *out)
{
    json_t *v = json_object_get(o, key);
    *out = 0;
    if (!v || json_is_null(v))
        return MC_OK;
    if (!json_is_boolean(v))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                       "\"%s\" must be true or false", key);
    *out = json_is_true(v);
    return MC_OK;
}

/* String or list of strings -> owned vector.  *n = 0, *out = NULL if
 * absent or null.  *is_string set when the value was a single string. */
static mc_status get_strv(pctx *p, json_t *o, const char *key, char ***out,
                          size_t *n, int *is_string, char **str)
{
    json_t *v = json_object_get(o, key);
    *out = NULL;
    *n = 0;
    if (is_string)
        *is_string = 0;
    if (!v || json_is_null(v))
        return MC_OK;
    if (json_is_string(v) && str) {
        *is_string = 1;
        *str = mc_strdup(json_string_value(v));
        return *str ? MC_OK : nomem(p);
    }
    if (json_is_string(v)) {
        char **a = mc_malloc(sizeof *a);
        if (!a || !(a[0] = mc_strdup(json_string_value(v)))) {
            mc_free(a);
            return nomem(p);
        }
        *out = a;
        *n = 1;
        return MC_OK;
    }
    if (!json_is_array(v))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                       "\"%s\" must be a string or a list of strings", key);
    size_t m = json_array_size(v);
    char **a = mc_calloc(m ? m : 1, sizeof *a);
    if (!a)
        return nomem(p);
    for (size_t i = 0; i < m; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_string(e)) {
            free_strv(a, i);
            return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                           "\"%s\"[%zu] must be a string", key, i);
        }
        if (!(a[i] = mc_strdup(json_string_value(e)))) {
            free_strv(a, i);
            return nomem(p);
        }
    }
    *out = a;
    *n = m;
    return MC_OK;
}

static mc_status get_select(pctx *p, json_t *o, const char *key,
                            fmt_peft_select *s)
{
    memset(s, 0, sizeof *s);
    int is_string;
    char *str = NULL;
    mc_status st = get_strv(p, o, key, &s->names, &s->n_names, &is_string,
                            &str);
    if (st)
        return st;
    json_t *v = json_object_get(o, key);
    s->present = v && !json_is_null(v);
    if (!is_string)
        return MC_OK;
    if (strcmp(str, "all-linear") == 0) {
        s->all_linear = 1;
        mc_free(str);
        return MC_OK;
    }
    s->regex = str;
    if (!regex_compiles(str, "(", ")"))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                       "\"%s\" regex \"%.200s\" does not compile (POSIX "
                       "extended syntax, at most %d characters, no stacked "
                       "quantifiers, counts <= %d)", key, str,
                       PEFT_REGEX_MAX / 16, PEFT_REGEX_MAX_COUNT);
    return MC_OK;
}

static mc_status get_patterns(pctx *p, json_t *o, const char *key, int is_rank,
                              fmt_peft_pattern **out, size_t *n)
{
    json_t *v = json_object_get(o, key);
    *out = NULL;
    *n = 0;
    if (!v || json_is_null(v))
        return MC_OK;
    if (!json_is_object(v))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, key, -1,
                       "\"%s\" must be an object of regex -> value", key);
    size_t m = json_object_size(v);
    fmt_peft_pattern *a = mc_calloc(m ? m : 1, sizeof *a);
    if (!a)
        return nomem(p);
    const char *k;
    json_t *e;
    size_t i = 0;
    mc_status st = MC_OK;
    json_object_foreach(v, k, e) {
        char field[300];
        snprintf(field, sizeof field, "%s.%s", key, k);
        if (is_rank ? !json_is_integer(e) : !json_is_number(e)) {
            st = mc_fail(p->err, MC_ERR_FORMAT, p->name, field, -1,
                         "%s value must be %s", key,
                         is_rank ? "an integer" : "a number");
            break;
        }
        double x = json_number_value(e);
        if (!isfinite(x) || x <= 0 || (is_rank && x > 65536)) {
            st = mc_fail(p->err, MC_ERR_FORMAT, p->name, field, -1,
                         "%s value %g is out of range (must be > 0%s)", key,
                         x, is_rank ? " and <= 65536" : "");
            break;
        }
        if (!regex_compiles(k, "(.*\\.)?(", ")")) {
            st = mc_fail(p->err, MC_ERR_FORMAT, p->name, field, -1,
                         "%s key is not a valid regex (POSIX extended "
                         "syntax, at most %d characters)", key,
                         PEFT_REGEX_MAX / 16);
            break;
        }
        if (!(a[i].key = mc_strdup(k))) {
            st = nomem(p);
            break;
        }
        a[i++].value = x;
    }
    if (st) {
        free_patterns(a, i);
        return st;
    }
    *out = a;
    *n = i;
    return MC_OK;
}

static mc_status get_layers(pctx *p, json_t *o, fmt_peft_config *c)
{
    json_t *v = json_object_get(o, "layers_to_transform");
    if (!v || json_is_null(v))
        return MC_OK;
    size_t m = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_integer(v))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, "layers_to_transform",
                       -1, "\"layers_to_transform\" must be an integer or a "
                       "list of integers");
    c->layers = mc_calloc(m ? m : 1, sizeof *c->layers);
    if (!c->layers)
        return nomem(p);
    for (size_t i = 0; i < m; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) > 1000000)
            return mc_fail(p->err, MC_ERR_FORMAT, p->name,
                           "layers_to_transform", -1,
                           "\"layers_to_transform\"[%zu] must be a "
                           "non-negative integer", i);
        c->layers[i] = json_integer_value(e);
    }
    c->n_layers = m;
    return MC_OK;
}

static mc_status get_init(pctx *p, json_t *o, fmt_peft_config *c)
{
    json_t *v = json_object_get(o, "init_lora_weights");
    snprintf(c->init, sizeof c->init, "true");
    if (!v || json_is_null(v))
        return MC_OK;
    if (json_is_boolean(v)) {
        snprintf(c->init, sizeof c->init, "%s",
                 json_is_true(v) ? "true" : "false");
        return MC_OK;
    }
    if (!json_is_string(v))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, "init_lora_weights",
                       -1, "\"init_lora_weights\" must be a boolean or a "
                       "string");
    const char *s = json_string_value(v);
    static const char *const base_changing[] = {"pissa", "olora", "corda",
                                                "loftq", "lora_ga"};
    for (size_t i = 0; i < sizeof base_changing / sizeof *base_changing; i++)
        if (strncmp(s, base_changing[i], strlen(base_changing[i])) == 0)
            return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name,
                           "init_lora_weights", -1,
                           "init_lora_weights \"%.40s\" changes the base "
                           "weights at init, so this adapter does not apply "
                           "to the original base: convert it at save time "
                           "(PEFT save_pretrained with "
                           "path_initial_model_for_weight_conversion) and "
                           "merge the converted adapter", s);
    static const char *const ok[] = {"gaussian", "eva", "orthogonal", "true",
                                     "false"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (strcmp(s, ok[i]) == 0) {
            snprintf(c->init, sizeof c->init, "%s", s);
            return MC_OK;
        }
    return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name, "init_lora_weights",
                   -1, "init_lora_weights \"%.40s\" is not supported", s);
}

static mc_status parse_root(pctx *p, json_t *o, fmt_peft_config *c)
{
    mc_status st;
    if (!json_is_object(o))
        return mc_fail(p->err, MC_ERR_FORMAT, p->name, NULL, -1,
                       "adapter config must be a JSON object");
    json_t *v = json_object_get(o, "peft_type");
    if (v && !json_is_null(v) &&
        (!json_is_string(v) || strcmp(json_string_value(v), "LORA") != 0))
        return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name, "peft_type", -1,
                       "peft_type %s%.32s%s is not supported (only LORA)",
                       json_is_string(v) ? "\"" : "",
                       json_is_string(v) ? json_string_value(v) : "(not a "
                                                                  "string)",
                       json_is_string(v) ? "\"" : "");
    v = json_object_get(o, "r");
    c->r = 8;
    if (v && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > 65536)
            return mc_fail(p->err, MC_ERR_FORMAT, p->name, "r", -1,
                           "\"r\" must be an integer in [1, 65536]");
        c->r = (uint32_t)json_integer_value(v);
    }
    v = json_object_get(o, "lora_alpha");
    c->lora_alpha = 8.0;
    if (v && !json_is_null(v)) {
        if (!json_is_number(v) || !isfinite(json_number_value(v)) ||
            json_number_value(v) <= 0)
            return mc_fail(p->err, MC_ERR_FORMAT, p->name, "lora_alpha", -1,
                           "\"lora_alpha\" must be a positive number");
        c->lora_alpha = json_number_value(v);
    }
    if ((st = get_bool(p, o, "use_rslora", &c->use_rslora)) ||
        (st = get_bool(p, o, "use_dora", &c->use_dora)) ||
        (st = get_bool(p, o, "fan_in_fan_out", &c->fan_in_fan_out)) ||
        (st = get_bool(p, o, "lora_bias", &c->lora_bias)))
        return st;
    int flag;
    if ((st = get_bool(p, o, "use_qalora", &flag)))
        return st;
    if (flag)
        return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name, "use_qalora", -1,
                       "QA-LoRA adapters are not supported");
    v = json_object_get(o, "layer_replication");
    if (v && !json_is_null(v))
        return mc_fail(p->err, MC_ERR_UNSUPPORTED, p->name,
                       "layer_replication", -1,
                       "layer_replication is not supported");
    v = json_object_get(o, "bias");
    c->bias = FMT_PEFT_BIAS_NONE;
    if (v && !json_is_null(v)) {
        const char *b = json_is_string(v) ? json_string_value(v) : "";
        if (strcmp(b, "none") == 0)
            c->bias = FMT_PEFT_BIAS_NONE;
        else if (strcmp(b, "all") == 0)
            c->bias = FMT_PEFT_BIAS_ALL;
        else if (strcmp(b, "lora_only") == 0)
            c->bias = FMT_PEFT_BIAS_LORA_ONLY;
        else
            return mc_fail(p->err, MC_ERR_FORMAT, p->name, "bias", -1,
                           "\"bias\" must be \"none\", \"all\" or "
                           "\"lora_only\"");
    }
    if ((st = get_select(p, o, "target_modules", &c->target)) ||
        (st = get_select(p, o, "exclude_modules", &c->exclude)) ||
        (st = get_layers(p, o, c)) ||
        (st = get_strv(p, o, "layers_pattern", &c->layers_pattern,
                       &c->n_layers_pattern, NULL, NULL)) ||
        (st = get_patterns(p, o, "rank_pattern", 1, &c->rank_pattern,
                           &c->n_rank_pattern)) ||
        (st = get_patterns(p, o, "alpha_pattern", 0, &c->alpha_pattern,
                           &c->n_alpha_pattern)) ||
        (st = get_strv(p, o, "modules_to_save", &c->modules_to_save,
                       &c->n_modules_to_save, NULL, NULL)) ||
        (st = get_init(p, o, c)))
        return st;
    v = json_object_get(o, "base_model_name_or_path");
    if (v && !json_is_null(v)) {
        if (!json_is_string(v))
            return mc_fail(p->err, MC_ERR_FORMAT, p->name,
                           "base_model_name_or_path", -1,
                           "\"base_model_name_or_path\" must be a string");
        snprintf(c->base_model, sizeof c->base_model, "%s",
                 json_string_value(v));
    }
    return MC_OK;
}

mc_status fmt_peft_config_parse(const char *text, size_t len, const char *name,
                                fmt_peft_config *out, mc_error *err)
{
    pctx p = {name ? name : "adapter_config.json", err};
    if (!out)
        return mc_fail(err, MC_ERR_INVALID_ARG, p.name, NULL, -1,
                       "NULL argument");
    memset(out, 0, sizeof *out);
    if (!text)
        return mc_fail(err, MC_ERR_INVALID_ARG, p.name, NULL, -1,
                       "NULL argument");
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        void *probe = mc_malloc(64); /* jansson hides OOM as syntax errors */
        mc_free(probe);
        if (!probe || json_error_code(&je) == json_error_out_of_memory)
            return nomem(&p);
        return mc_fail(err, MC_ERR_FORMAT, p.name, NULL, je.position,
                       "invalid JSON at line %d column %d: %s", je.line,
                       je.column, je.text);
    }
    mc_status st = parse_root(&p, root, out);
    json_decref(root);
    if (st)
        fmt_peft_config_free(out);
    return st;
}
