/* fuzz_marker.c - the directory-output marker's list (fmt_input.h,
 * fmt_output_marker_lists): any bytes, any name, give -1, 0 or 1, never a
 * read past the text; a name is listed exactly when a whole line after
 * the first "\nfiles:\n" is that name.  Input: the first byte is the
 * name's length (at most the rest), the name, then the marker text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_input.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The same question answered the slow way. */
static int listed_slowly(const char *t, size_t len, const char *name)
{
    static const char head[] = "\nfiles:\n";
    size_t hl = sizeof head - 1, nl = strlen(name), s = 0;
    while (s + hl <= len && memcmp(t + s, head, hl) != 0)
        s++;
    if (s + hl > len)
        return -1;
    size_t line = s + hl;
    for (size_t i = line; i < len; i++)
        if (t[i] == '\n') {
            if (i - line == nl && memcmp(t + line, name, nl) == 0)
                return 1;
            line = i + 1;
        }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t nl = data[0];
    if (nl > size - 1)
        nl = size - 1;
    char name[256];
    memcpy(name, data + 1, nl);
    name[nl] = '\0'; /* a NUL inside cuts the name, as a file name would */
    size_t len = size - 1 - nl;
    /* the text in a buffer of its own size: a read past it is caught */
    char *text = malloc(len ? len : 1);
    if (!text)
        return 0;
    memcpy(text, data + 1 + nl, len);
    int got = fmt_output_marker_lists(text, len, name);
    if (got != listed_slowly(text, len, name))
        abort();
    free(text);
    return 0;
}
