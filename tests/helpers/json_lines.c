/* json_lines.c - a JSON Lines file, parsed (see json_lines.h). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "json_lines.h"
#include "testutil.h"

json_t **tu_json_lines(const char *path, size_t *n)
{
    size_t len;
    char *text = tu_read_file(path, &len);
    assert_non_null(text);
    json_t **v = calloc(len + 1, sizeof *v);
    assert_non_null(v);
    *n = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l;
         l = strtok_r(NULL, "\n", &save)) {
        json_error_t je;
        v[*n] = json_loads(l, 0, &je);
        if (!v[*n])
            fail_msg("%s line %zu: not JSON: %s", path, *n + 1, je.text);
        (*n)++;
    }
    free(text);
    return v;
}

void tu_json_lines_free(json_t **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        json_decref(v[i]);
    free(v);
}
